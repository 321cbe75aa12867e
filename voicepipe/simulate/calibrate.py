"""`voicepipe simulate calibrate`: measure the calibration runs on this CPU and fit its step-cost model.

Each model step the real engine runs is recorded with its shape and its time (the driver's, plan to outputs);
the fit (scheduler.step_cost) is cached per machine (`costs.machine_fit_path`), where `--device cpu-measured`
reads it. Set-up makes it (`python -m voicepipe.simulate.calibrate --if-missing`), and the first run that
needs it makes it where set-up did not. A fit made while other work kept the cores busy is pessimistic: it
notes the load average it was made under, and is made again once the machine is clearly quieter.
"""

import logging
import os
import platform
import time
from pathlib import Path

from scheduler.sim import FittedCost, StepShape
from voicepipe.simulate import cpu_runs
from voicepipe.simulate.costs import CPU, FITTED, JOB_PRICES, machine_fit_path
from voicepipe.simulate.run import measure

log = logging.getLogger(__name__)
QUIETER = 0.75  # how much lower the load average must be now than when the cached fit was made, to fit again


def measure_runs(names: dict, model, tokenizer) -> dict[str, dict]:
    runs = {}
    for name, scenario in cpu_runs.named(names).items():
        t0 = time.perf_counter()
        runs[name] = measure(scenario, model, tokenizer, JOB_PRICES[CPU], **cpu_runs.engine_fields())
        log.info("measured %s: %d steps in %.1f s", name, len(runs[name]["steps_measured"]), time.perf_counter() - t0)
    return runs


def fit_runs(runs: dict[str, dict], load_before: float = 0.0) -> FittedCost:
    steps = [(StepShape(**shape), seconds) for run in runs.values() for shape, seconds in run["steps_measured"]]
    import torch

    about = {"model": FITTED[0], "precision": FITTED[1], "fitted_on": list(runs),
             "machine": f"{platform.platform()}, torch {torch.__version__}, {torch.get_num_threads()} threads",
             "date": time.strftime("%Y-%m-%d"), "load_before": round(load_before, 2)}
    return FittedCost.fit([s for s, _ in steps], [t for _, t in steps], about)


def calibrate(path: Path | None = None) -> FittedCost:
    """Measure the calibration runs, fit them, and cache the fit (at `path`, else this machine's place)."""
    path = path or machine_fit_path()
    log.warning("fitting this machine's step costs on the calibration runs (a few minutes, once)")
    load_before = os.getloadavg()[0]
    model, tokenizer = cpu_runs.load_model()
    fit = fit_runs(measure_runs(cpu_runs.calibration_set(), model, tokenizer), load_before)
    path.parent.mkdir(parents=True, exist_ok=True)
    fit.save(path)
    return fit


def machine_fit() -> FittedCost:
    """This machine's fit: the cached one, else (or if it was made on a busier machine than this is now) made
    now."""
    path = machine_fit_path()
    if path.exists():
        cached = FittedCost.load(path)
        if cached.about.get("load_before", 0.0) < os.getloadavg()[0] + QUIETER:
            return cached
        log.warning("this machine's fit was made under a load average of %s: fitting again",
                    cached.about["load_before"])
    return calibrate(path)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m voicepipe.simulate.calibrate")
    parser.add_argument("--if-missing", action="store_true", help="only where this machine has no fit yet")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    fit = machine_fit() if args.if_missing else calibrate()
    print_fit(fit)
    print(f"this machine's fit: {machine_fit_path()}")
    return 0


def print_fit(fit: FittedCost) -> None:
    a = fit.about
    print(f"fitted on {a['steps']} steps of {', '.join(a['fitted_on'])} ({a['outliers_left_out']} left out as "
          f"outliers): step time error p50 {a['relative_error_p50']:.1%}, p90 {a['relative_error_p90']:.1%}, "
          f"total time {a['total_time_error']:+.1%}")
    for term, value in fit.coefficients.items():
        print(f"  {term:16} {value:.3e} s")


if __name__ == "__main__":
    raise SystemExit(main())
