"""`bench engine`: its options and its run (the engine's policies and transformers' batching side by side,
the decode roofline, the knob sweep). Apart from the command line, so `python -m voicepipe.bench engine`
loads only what the engine needs."""

import argparse
import logging
import statistics
import time

from scheduler.config import DEFAULT_POLICY
from scheduler.policies import POLICIES
from voicepipe.backends.arguments import add_llm_model_arguments
from voicepipe.bench.engine_setup import add_engine_setup_arguments
from voicepipe.bench.report import add_json_argument, machine, save
from voicepipe.bench.workload import Workload

log = logging.getLogger(__name__)
MODES = (*POLICIES, "hf_static", "hf_cb")  # the engine's policies, then transformers' own batching
WORKLOADS = ("mixed", "poisson", "all_at_once")
COLUMNS = ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_argument(parser)
    parser.add_argument("--plot", metavar="FILE.png", help="draw the results")
    parser.add_argument("--quick", action="store_true", help="a small workload (minutes, not tens of minutes)")
    parser.add_argument("--sweep", action="store_true", help="sweep max_batch_tokens x max_batch_seqs instead")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--rounds", type=positive, default=1,
                        help="run the modes this many times, in reverse order every other round, and report each "
                             "mode's medians (one mode ranged from 97 to 137 tok/s across three runs here)")
    add_llm_model_arguments(parser)
    parser.add_argument("--max-batch-tokens", type=int, help="tokens per step (default: the engine's)")
    parser.add_argument("--max-batch-seqs", type=int, help="sequences per step (default: the engine's)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)} (mixed always runs)")
    parser.add_argument("--precisions", metavar="LIST",
                        help="comma-separated weight precisions (e.g. fp32,int8,int4), each measured in this run: "
                             "batch-1 and batch-16 decode against the bandwidth limit, and all-at-once "
                             "throughput against transformers' generate in static batches of 32")
    add_engine_setup_arguments(parser)


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return int(text)


def workloads(quick: bool) -> dict[str, Workload]:
    """The mixed burst (output lengths vary), the same requests under Poisson arrivals, and an all-at-once
    batch of equal outputs, the case plain static `generate` is best at."""
    if quick:
        return {"mixed": Workload(requests=12, prompt_tokens=(32, 128), output_tokens=(8, 48)),
                "poisson": Workload(12, (32, 128), (8, 48), poisson_rate=2.0),
                "all_at_once": Workload(12, (32, 128), (24, 24))}
    return {"mixed": Workload(), "poisson": Workload(poisson_rate=0.5),
            "all_at_once": Workload(32, (32, 256), (64, 64))}


def compare_modes(model, tokenizer, workload: Workload, modes: list[str], settings: dict, rounds: int = 1) -> dict:
    """Each mode on the workload, `rounds` times (the order reversed every other round, so none always runs
    first), each figure its median; `settings` are the engine's (the knobs, the precision)."""
    from scheduler import EngineConfig
    from voicepipe.bench.engine_modes import run_engine, run_hf_continuous_batching, run_hf_static
    from voicepipe.bench.engine_setup import items_for, release_device_memory

    items = items_for(workload, tokenizer)
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for n in range(rounds):
        for mode in modes if n % 2 == 0 else modes[::-1]:
            release_device_memory()
            log.info("running %s on %d requests", mode, len(items))
            if mode == "hf_static":
                result = run_hf_static(model, tokenizer, items)
            elif mode == "hf_cb":
                try:
                    result = run_hf_continuous_batching(model, items)
                except Exception as exc:  # an optional peer: report why it could not run
                    result = {"error": f"{type(exc).__name__}: {exc}"}
            else:
                result = run_engine(model, tokenizer, items, EngineConfig(policy=mode, **settings))
            runs[mode].append(result)
    return {mode: medians(results) for mode, results in runs.items()}


def medians(results: list[dict]) -> dict:
    """One mode's runs as one: each number its median, and every run's throughput beside it."""
    failed = next((r for r in results if "error" in r), None)
    if len(results) == 1 or failed is not None:
        return failed or results[0]
    numbers = {k for k, v in results[0].items() if isinstance(v, int | float) and not isinstance(v, bool)}
    merged = {k: statistics.median(r[k] for r in results) if k in numbers else v for k, v in results[0].items()}
    return {**merged, "rounds_throughput_tok_s": [r["throughput_tok_s"] for r in results]}


def sweep(model, tokenizer, quick: bool, settings: dict) -> list[dict]:
    """Each (max_batch_tokens, max_batch_seqs) of a grid; `settings` are the engine's other fields."""
    from scheduler import EngineConfig
    from voicepipe.bench.engine_modes import run_engine
    from voicepipe.bench.engine_setup import items_for, release_device_memory

    workload = Workload(requests=8 if quick else 24, prompt_tokens=(32, 128 if quick else 256),
                        output_tokens=(8, 24 if quick else 64))
    items = items_for(workload, tokenizer)
    tokens_grid = (64, 256) if quick else (32, 64, 128, 256, 512)
    seqs_grid = (2, 8) if quick else (2, 4, 8, 16, 32)
    rows = []
    for max_batch_tokens in tokens_grid:
        for max_batch_seqs in seqs_grid:
            release_device_memory()
            result = run_engine(model, tokenizer, items, EngineConfig(max_batch_tokens=max_batch_tokens,
                                                                      max_batch_seqs=max_batch_seqs, **settings))
            rows.append({"max_batch_tokens": max_batch_tokens, "max_batch_seqs": max_batch_seqs, **result})
            log.info("tokens=%d seqs=%d: %.1f tok/s", max_batch_tokens, max_batch_seqs, result["throughput_tok_s"])
    return rows


def print_table(title: str, modes: dict) -> None:
    print(f"\n{title}")
    print(f"{'mode':10}" + "".join(f"{c:>18}" for c in COLUMNS))
    for mode, m in modes.items():
        cells = [f"{m[c]:18.2f}" if c in m else f"{'-':>18}" for c in COLUMNS]
        print(f"{mode:10}" + "".join(cells) + (f"  ({m['error']})" if "error" in m else ""))


def run_engine_bench(args: argparse.Namespace) -> int:
    from scheduler import EngineConfig
    from voicepipe.bench.engine_modes import decode_roofline
    from voicepipe.bench.engine_setup import engine_settings, load_bench_model, roofline_prompt

    engine = engine_settings(args)  # before loading: a device that cannot run the precision fails at once
    model, tokenizer = load_bench_model(args, engine)
    defaults = EngineConfig()
    knobs = {"max_batch_tokens": args.max_batch_tokens or defaults.max_batch_tokens,
             "max_batch_seqs": args.max_batch_seqs or defaults.max_batch_seqs}
    report: dict = {"machine": machine(engine["device"]), "knobs": knobs, "precision": engine["precision"],
                    "engine": engine, "model": args.random_weights and f"random weights, shape {args.random_weights}",
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    settings = {**knobs, **engine}
    if args.sweep:
        report["sweep"] = sweep(model, tokenizer, args.quick, engine)
        for row in report["sweep"]:
            print(f"max_batch_tokens={row['max_batch_tokens']:4d} max_batch_seqs={row['max_batch_seqs']:3d} "
                  f"{row['throughput_tok_s']:8.1f} tok/s  p99 latency {row['latency_p99_s']:6.2f} s")
    else:
        modes = [m for m in args.modes.split(",") if m]
        unknown = set(modes) - set(MODES)
        if unknown:
            raise SystemExit(f"voicepipe: error: unknown modes {', '.join(sorted(unknown))}")
        chosen = [w for w in args.workloads.split(",") if w]
        unknown = set(chosen) - set(WORKLOADS)
        if unknown:
            raise SystemExit(f"voicepipe: error: unknown workloads {', '.join(sorted(unknown))}")
        loads = workloads(args.quick)
        report["workload"] = loads["mixed"].describe()
        report["modes"] = compare_modes(model, tokenizer, loads["mixed"], modes, settings, args.rounds)
        print_table("mixed: all requests at once, output lengths vary", report["modes"])
        for name, title in (("poisson", f"Poisson arrivals, {loads['poisson'].poisson_rate}/s"),
                            ("all_at_once", "all at once, equal output lengths")):
            if name not in chosen:
                continue
            report[name] = {"workload": loads[name].describe(),
                            "modes": compare_modes(model, tokenizer, loads[name], modes, settings, args.rounds)}
            print_table(title, report[name]["modes"])
        report["roofline"] = decode_roofline(model, tokenizer, engine["precision"],
                                             prompt_ids=roofline_prompt(tokenizer),
                                             settings={"device": engine["device"], "kv_dtype": engine["kv_dtype"]})
        r = report["roofline"]
        print(f"\nbatch-1 decode {r['batch1_decode_tok_s']:.1f} tok/s; bandwidth limit {r['limit_tok_s']:.1f} tok/s "
              f"({r['bandwidth_gb_s']:.1f} GB/s over {r['weight_bytes'] / 1e6:.0f} MB of weights): "
              f"{r['ratio_of_limit']:.2f} of the limit; batch-16 decode {r['batch16_decode_tok_s']:.1f} tok/s: "
              f"{r['batch16_ratio_of_limit']:.2f} of its limit")
        if args.precisions:
            hf = report.get("all_at_once", {}).get("modes", {}).get("hf_static")
            report["precisions"] = compare_precisions(model, tokenizer, args.precisions.split(","), settings,
                                                      loads["all_at_once"], hf)
            print_precisions(report["precisions"])
        ratios = ratios_of(report["modes"])
        if "all_at_once" in report:
            ratios.update({f"all_at_once_{k}": v for k, v in ratios_of(report["all_at_once"]["modes"]).items()})
        report["ratios"] = ratios
        for name, value in ratios.items():
            print(f"{name}: {value:.2f}")
    if args.json:
        save(report, args.json)
    if args.plot:
        from voicepipe.bench.plots import plot_report

        plot_report(report, args.plot)
    return 0


def compare_precisions(model, tokenizer, precisions: list[str], settings: dict, load: Workload,
                       hf_static: dict | None) -> dict:
    """For each precision: decode at batch 1 and 16 against the bandwidth limit, and all-at-once throughput
    (W, o4) against transformers' `generate` in static batches of 32 (`hf_static`, run here if not given)."""
    from scheduler import EngineConfig
    from scheduler.model.device import check_precision, resolve_device
    from voicepipe.bench.engine_modes import decode_roofline, measure_bandwidth, run_engine, run_hf_static
    from voicepipe.bench.engine_setup import items_for, release_device_memory, roofline_prompt

    for precision in precisions:  # all checked before anything runs
        check_precision(resolve_device(settings["device"]), precision)
    items = items_for(load, tokenizer)
    hf = (hf_static or run_hf_static(model, tokenizer, items, batch_size=32))["throughput_tok_s"]
    rows = {}
    device = next(model.parameters()).device  # one bandwidth for every row: the limits then compare
    bandwidth = measure_bandwidth(device, min(sum(p.numel() * p.element_size() for p in model.parameters()), 4 << 30))
    for precision in precisions:
        release_device_memory()
        roof = decode_roofline(model, tokenizer, precision, prompt_ids=roofline_prompt(tokenizer),
                               settings={"device": settings["device"], "kv_dtype": settings["kv_dtype"]},
                               bandwidth=bandwidth)
        w = run_engine(model, tokenizer, items, EngineConfig(**{**settings, "policy": "o4", "precision": precision}))
        rows[precision] = {**roof, "all_at_once_tok_s": w["throughput_tok_s"],
                           "all_at_once_vs_hf_static_32": w["throughput_tok_s"] / hf}
    return {"workload": load.describe(), "hf_static_32_tok_s": hf, "by_precision": rows}


def print_precisions(table: dict) -> None:
    print(f"\nprecisions, this run (generate static-32, all at once: {table['hf_static_32_tok_s']:.1f} tok/s)")
    print(f"{'precision':10}{'MB/step':>9}{'limit tok/s':>12}{'batch 1':>9}{'of limit':>9}{'batch 16':>10}"
          f"{'of limit':>9}{'W tok/s':>9}{'W/generate':>11}")
    for precision, r in table["by_precision"].items():
        print(f"{precision:10}{r['weight_bytes'] / 1e6:9.0f}{r['limit_tok_s']:12.1f}{r['batch1_decode_tok_s']:9.1f}"
              f"{r['ratio_of_limit']:9.2f}{r['batch16_decode_tok_s']:10.1f}{r['batch16_ratio_of_limit']:9.2f}"
              f"{r['all_at_once_tok_s']:9.1f}{r['all_at_once_vs_hf_static_32']:11.2f}")


def ratios_of(modes: dict) -> dict:
    out = {}
    ours = modes.get(DEFAULT_POLICY, {})
    for peer in MODES:
        m = modes.get(peer, {}) if peer != DEFAULT_POLICY else {}
        if "throughput_tok_s" in ours and "throughput_tok_s" in m:
            out[f"{DEFAULT_POLICY}_vs_{peer}_throughput"] = ours["throughput_tok_s"] / m["throughput_tok_s"]
            out[f"{DEFAULT_POLICY}_vs_{peer}_latency_p99"] = ours["latency_p99_s"] / m["latency_p99_s"]
    return out
