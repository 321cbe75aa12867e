"""`voicepipe simulate run`: the command line's options made into scenarios, one per policy, and run."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

from scheduler.policies import POLICIES
from scheduler.sim import Efficiency
from voicepipe.simulate.calls import CallLoad
from voicepipe.simulate.costs import CPU, FITTED, priced, served_fit
from voicepipe.simulate.report import print_runs, save
from voicepipe.simulate.run import Scenario, simulate
from voicepipe.simulate.text import SEED, TextLoad, trace_items

ARRIVALS = {"poisson": "poisson", "burst": "burst", "all-at-once": "all_at_once", "seed": "poisson"}


def text_load(args: argparse.Namespace) -> TextLoad | None:
    if args.workload in ("none", "trace"):
        return None
    base = SEED if args.workload == "seed" else TextLoad(prompt_tokens=(32, 256), output_tokens=(16, 256))
    rate = args.rate if args.rate is not None else (SEED.rate if args.workload == "seed" else 1.0)
    return replace(base, arrivals=ARRIVALS[args.workload], rate=rate, duration_s=args.duration,
                   requests=args.requests, prompt_tokens=args.prompt_tokens or base.prompt_tokens,
                   output_tokens=args.output_tokens or base.output_tokens, burst_size=args.burst_size, seed=args.seed)


def scenarios(args: argparse.Namespace) -> dict[str, Scenario]:
    policies = [p for p in args.policy.split(",") if p]
    unknown = set(policies) - set(POLICIES)
    if unknown or not policies:
        raise ValueError(f"unknown policies {', '.join(sorted(unknown)) or '(none)'}; "
                         f"choose from {', '.join(POLICIES)}")
    knobs = {k: v for k, v in (("max_batch_tokens", args.max_batch_tokens), ("max_batch_seqs", args.max_batch_seqs))
             if v is not None}
    static = args.static_batch_size or (None if args.device == CPU else 32)
    engine = {"static_batch_size": static} if static else {}
    calls = CallLoad(calls=args.calls, turns=args.turns, seed=args.seed) if args.calls else None
    load = text_load(args)
    if load is None and calls is None and args.workload != "trace":
        raise ValueError("nothing to run: --workload none needs --calls")
    return {p: Scenario(p, knobs, load, calls=calls, engine=engine, slo=(args.slo_ttft, args.slo_tpot),
                        max_wait_s=args.max_wait, name=p) for p in policies}


def efficiency(args: argparse.Namespace) -> Efficiency:
    if args.efficiency_file:
        return Efficiency(**json.loads(Path(args.efficiency_file).read_text())["efficiency"])
    return Efficiency.band()[args.efficiency]


def run_scenarios(args: argparse.Namespace) -> int:
    if args.device == CPU and (args.model, args.dtype) == FITTED and served_fit(args.dtype) is None:
        from voicepipe.simulate.calibrate import machine_fit

        machine_fit()  # no engine has served here yet: the calibrated fit, made on first use where set-up did not
    target = priced(args.device, args.model, args.dtype, efficiency(args))
    runs = {}
    for name, scenario in scenarios(args).items():
        if args.workload == "trace":
            if not args.trace:
                raise ValueError("--workload trace needs --trace FILE")
            runs[name] = simulate(scenario, target, trace_items(args.trace, target.shape.vocab))
        else:
            runs[name] = simulate(scenario, target)
    first = next(iter(runs.values()))
    print_runs(runs, f"{args.model} {args.dtype} on {args.device} ({target.about['cost_model']}), "
                     f"{args.workload} workload" + (f", {args.calls} calls" if args.calls else ""))
    if args.json:
        save({"target": target.about, "scenario": first["scenario"], "runs": runs}, args.json)
    return 0
