"""`python -m voicepipe.simulate.recalibrate`: on a GPU, fit the roofline's efficiencies to the engine's own steps.

The real engine runs a random-weight model of a named shape (voicepipe.bench.random_weights) on CUDA over
two workloads of the seed's kind: the steps of the first fit MFU, MBU and the overhead
(scheduler.sim.efficiency_fit), the second is simulated with the fit and set beside its measurement, as
`voicepipe simulate validate` does on a CPU. The fit goes to a JSON file that `voicepipe simulate
--efficiency-file` prices with. Wall-clock timing is right here: each step copies its sampled tokens to the
host, so the host waits for the device every step. Needs only torch, transformers and this repository.
"""

import argparse
import json
import sys
from dataclasses import asdict, replace

from scheduler.sim import DEVICES, DTYPES, Roofline, StepShape, WallClock
from scheduler.sim.efficiency_fit import fit_efficiency
from voicepipe.simulate.costs import JOB_PRICES, Priced, model_shape
from voicepipe.simulate.run import Scenario, measure, simulate
from voicepipe.simulate.text import SEED
from voicepipe.simulate.validate import compare_runs

SHAPES = {"13b": "llama-2-13b", "default": "smollm2-135m"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voicepipe.simulate.recalibrate")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="13b")
    parser.add_argument("--datasheet", choices=tuple(DEVICES), default="h100",
                        help="whose published rates the fitted fractions are of (the GPU at hand)")
    parser.add_argument("--precision", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--kv-gib", type=float, default=16.0, help="the KV cache over all layers (default 16)")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second of the fitting run")
    parser.add_argument("--duration", type=float, default=30.0, metavar="S")
    parser.add_argument("--json", metavar="FILE", default="efficiency.json")
    args = parser.parse_args(argv)

    import torch

    from scheduler.model.device import WEIGHT_DTYPES
    from voicepipe.bench.random_weights import random_llm

    if not torch.cuda.is_available():
        print("recalibrate: no CUDA device here; this fits a GPU's step times", file=sys.stderr)
        return 2
    name = SHAPES[args.shape]
    model, tokenizer = random_llm(args.shape, "cuda", WEIGHT_DTYPES[args.precision])
    engine = {"device": "cuda", "precision": args.precision, "kv_bytes": int(args.kv_gib * (1 << 30))}
    knobs = {"max_batch_tokens": 4096, "max_batch_seqs": 256}
    fit_load = replace(SEED, rate=args.rate, duration_s=args.duration, seed=7)
    check_load = replace(SEED, rate=args.rate * 1.5, duration_s=args.duration, seed=8)
    runs = {}
    for label, load, policy in (("fit", fit_load, "fcfs"), ("check", check_load, "o4")):
        runs[label] = measure(Scenario(policy, knobs, load, name=label), model, tokenizer, JOB_PRICES["h100"],
                              clock=WallClock(), **engine)
    steps = [(StepShape(**shape), seconds) for shape, seconds in runs["fit"]["steps_measured"]]
    roofline = Roofline(model_shape(name), DEVICES[args.datasheet], DTYPES["fp16"])
    efficiency, info = fit_efficiency(roofline, [s for s, _ in steps], [t for _, t in steps])
    target = Priced(roofline.shape, Roofline(roofline.shape, roofline.device, roofline.dtype, efficiency),
                    JOB_PRICES["h100"], {"kv_bytes": engine["kv_bytes"]}, {"cost_model": "roofline, fitted"})
    check = compare_runs("check", [runs["check"]], simulate(Scenario("o4", knobs, check_load), target), 0.0,
                         (1.0, 1.0))
    report = {"efficiency": asdict(efficiency), "fit": info, "shape": name, "datasheet": args.datasheet,
              "precision": args.precision, "gpu": torch.cuda.get_device_name(), "check": check}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"{report['gpu']}: MFU {efficiency.mfu:.2f}, MBU {efficiency.mbu:.2f}, overhead "
          f"{1e3 * efficiency.overhead_s:.2f} ms (of the {args.datasheet} datasheet; step error p50 "
          f"{info['relative_error_p50']:.1%}, p90 {info['relative_error_p90']:.1%} over {info['steps']} steps)")
    for key, diff in check["differences"].items():
        print(f"  check run {key:18} measured {check['measured'][key]:9.3f} simulated {check['simulated'][key]:9.3f}"
              f" {diff:+7.1%}")
    print(f"written to {args.json}; price with: voicepipe simulate --device {args.datasheet} --efficiency-file "
          f"{args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
