"""`voicepipe simulate`: a scenario on a simulated device, and the simulator's own checks.

    voicepipe simulate [run] --device a100-80g --model llama-2-13b --dtype int8 --workload seed --rate 8
    voicepipe simulate calibrate   fit this CPU's step costs on measured runs (minutes)
    voicepipe simulate validate    measured vs simulated on runs the fit never saw (minutes)
    voicepipe simulate seed        the seed article's experiment on an A100 and an H100
    voicepipe simulate public      the roofline against LMDeploy's published 13B step times

Building the parser imports nothing heavy; the engine and torch load when a run starts.
"""

import argparse
import sys

from scheduler.policies import POLICIES
from voicepipe.cli.command import UsageError

ACTIONS = ("run", "calibrate", "validate", "seed", "public")
WORKLOADS = ("seed", "poisson", "burst", "all-at-once", "trace", "none")


def token_range(text: str) -> tuple[int, int]:
    """argparse type of a length range, "A-B" (or one number)."""
    low, _, high = text.partition("-")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 1 <= A <= B, got {text!r}")
    return lo, hi


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.simulate.costs import DEVICE_NAMES, MODELS

    parser.add_argument("action", nargs="?", choices=ACTIONS, default="run",
                        help="run a scenario (default), or one of the simulator's own checks")
    parser.add_argument("--device", choices=DEVICE_NAMES, default="a100-80g",
                        help="a GPU priced by its datasheet (roofline), or cpu-measured: this CPU's fitted model")
    parser.add_argument("--model", choices=tuple(MODELS), default="llama-2-13b")
    parser.add_argument("--dtype", default="int8",
                        help="weights: int8 (W8A8), w8a16 (int8 weights, FP16 products) or fp16 on a GPU; "
                             "on cpu-measured, the precision an engine served smollm2-135m in here (its own fit, "
                             "kept), or int8 (the calibrated fit)")
    parser.add_argument("--efficiency", choices=("low", "central", "high"), default="central",
                        help="the roofline's efficiency factors: the central estimate or an end of its range")
    parser.add_argument("--efficiency-file", metavar="FILE",
                        help="efficiency factors fitted on a GPU (python -m voicepipe.simulate.recalibrate)")
    parser.add_argument("--workload", choices=WORKLOADS, default="seed",
                        help="text traffic: seed (the article's: 128-2,048 in, 16-256 out, Poisson), poisson, "
                             "burst (groups arriving together), all-at-once, trace (--trace), none (calls only)")
    parser.add_argument("--rate", type=float, help="requests per second (default: 200 for seed, else 1)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="S", help="seconds of arrivals (default 60)")
    parser.add_argument("--requests", type=int, metavar="N", help="all-at-once: how many; else at most this many")
    parser.add_argument("--prompt-tokens", type=token_range, metavar="A-B", help="prompt lengths, uniform")
    parser.add_argument("--output-tokens", type=token_range, metavar="A-B", help="output lengths, uniform")
    parser.add_argument("--burst-size", type=int, default=32, help="burst: requests arriving together")
    parser.add_argument("--trace", metavar="FILE", help="JSON lines of arrival_s, prompt_tokens, output_tokens")
    parser.add_argument("--policy", default=",".join(POLICIES),
                        help=f"comma-separated, of {', '.join(POLICIES)} (default: all of them)")
    parser.add_argument("--max-batch-tokens", type=int, metavar="N", help="the token knob (default: the engine's)")
    parser.add_argument("--max-batch-seqs", type=int, metavar="N", help="the sequence knob (default: the engine's)")
    parser.add_argument("--static-batch-size", type=int, metavar="N", help="static's batch (default 32 on a GPU)")
    parser.add_argument("--calls", type=int, default=0, metavar="K", help="voice calls beside the text traffic")
    parser.add_argument("--turns", type=int, default=4, help="turns each call makes (default 4)")
    parser.add_argument("--slo-ttft", type=float, default=2.0, metavar="S", help="goodput's TTFT bound (default 2)")
    parser.add_argument("--slo-tpot", type=float, default=0.1, metavar="S", help="goodput's TPOT bound (default 0.1)")
    parser.add_argument("--max-wait", type=float, default=60.0, metavar="S",
                        help="stop when a request has waited this long for its first token (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="the workload's random seed")
    parser.add_argument("--quick", action="store_true", help="calibrate, validate, seed: smaller, faster runs")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")


def run_simulate(args: argparse.Namespace) -> int:
    try:
        if args.action == "run":
            from voicepipe.simulate.scenario_cli import run_scenarios

            return run_scenarios(args)
        from voicepipe.simulate import actions

        return getattr(actions, args.action)(args)
    except ValueError as e:
        raise UsageError(str(e)) from None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m voicepipe.cli.simulate")
    add_simulate_arguments(parser)
    sys.exit(run_simulate(parser.parse_args()))
