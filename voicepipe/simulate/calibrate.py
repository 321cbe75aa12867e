"""`voicepipe simulate calibrate`: measure the calibration runs on this CPU and fit its step-cost model.

Each model step the real engine runs is recorded with its shape and its time (the driver's, plan to outputs);
the fit (scheduler.sim.fitted) goes to voicepipe/simulate/fits/, where `--device cpu-measured` reads it.
"""

import logging
import platform
import time
from pathlib import Path

from scheduler.sim import FittedCost, StepShape
from voicepipe.simulate import cpu_runs
from voicepipe.simulate.costs import CPU, FIT, JOB_PRICES
from voicepipe.simulate.run import measure

log = logging.getLogger(__name__)


def measure_runs(names: dict, model, tokenizer) -> dict[str, dict]:
    runs = {}
    for name, scenario in cpu_runs.named(names).items():
        t0 = time.perf_counter()
        runs[name] = measure(scenario, model, tokenizer, JOB_PRICES[CPU], **cpu_runs.engine_fields())
        log.info("measured %s: %d steps in %.1f s", name, len(runs[name]["steps_measured"]), time.perf_counter() - t0)
    return runs


def fit_runs(runs: dict[str, dict]) -> FittedCost:
    steps = [(StepShape(**shape), seconds) for run in runs.values() for shape, seconds in run["steps_measured"]]
    import torch

    about = {"model": cpu_runs.MODEL, "precision": cpu_runs.PRECISION, "fitted_on": list(runs),
             "machine": f"{platform.platform()}, torch {torch.__version__}, {torch.get_num_threads()} threads",
             "date": time.strftime("%Y-%m-%d")}
    return FittedCost.fit([s for s, _ in steps], [t for _, t in steps], about)


def calibrate(path: Path = FIT) -> FittedCost:
    model, tokenizer = cpu_runs.load_model()
    fit = fit_runs(measure_runs(cpu_runs.calibration_set(), model, tokenizer))
    path.parent.mkdir(parents=True, exist_ok=True)
    fit.save(path)
    return fit


def print_fit(fit: FittedCost) -> None:
    a = fit.about
    print(f"fitted on {a['steps']} steps of {', '.join(a['fitted_on'])} ({a['outliers_left_out']} left out as "
          f"outliers): step time error p50 {a['relative_error_p50']:.1%}, p90 {a['relative_error_p90']:.1%}, "
          f"total time {a['total_time_error']:+.1%}")
    for term, value in fit.coefficients.items():
        print(f"  {term:16} {value:.3e} s")
