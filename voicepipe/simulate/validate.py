"""`voicepipe simulate validate`: this CPU measured against the simulator on runs its fit never read.

In one process: the calibration runs are measured and fitted, then each validation scenario is measured on
the real engine and simulated with that fit, and the figures are set side by side (measured, simulated,
difference), as LLMServingSim's validation tables do. The 2 cores are shared with other work, whose load
comes and goes. So every run is timed by the engine thread's CPU time (`ThreadClock`: torch on one thread
runs each step on it), which leaves out what the other processes ran; and since they still share the
caches and memory bandwidth, before and after each validation run a short calibration run (the probe) is
measured again and the fit scaled by how much slower the machine ran it than the fit predicts: two
factors, one for the products (per token, per attention pair) and one for the rest (weights and keys
read, host work), since others' work takes more of a decode's memory bandwidth than of a prompt's
products; read off a calibration workload, never off the validated run (the JSON holds the unscaled
differences too). Each validation run is measured twice: how far apart the two are is the noise floor a
difference is read against. The load average is reported with each.
"""

import logging
import os
import time

import numpy as np

from scheduler import EngineConfig
from scheduler.sim import FittedCost, StepShape
from scheduler.step_cost import nonnegative_lstsq
from voicepipe.simulate import cpu_runs
from voicepipe.simulate.calibrate import fit_runs, measure_runs
from voicepipe.simulate.costs import CPU, JOB_PRICES, Priced, model_shape
from voicepipe.simulate.run import simulate

log = logging.getLogger(__name__)
FIGURES = (("text", "throughput_tok_s"), ("text", "ttft_p50_s"), ("text", "ttft_p99_s"), ("text", "latency_p50_s"),
           ("text", "latency_p99_s"), ("calls", "ttfa_p50_s"), ("calls", "ttfa_p99_s"), ("calls", "on_time_rate"))
# What the simulator is held to: 10% on throughput and the p50s, 20% on the p99s, 5 points on the share of
# turns on time (a share is compared by its difference, not relatively).
TARGETS = {"throughput_tok_s": 0.10, "ttft_p50_s": 0.10, "latency_p50_s": 0.10, "ttft_p99_s": 0.20,
           "latency_p99_s": 0.20, "ttfa_p50_s": 0.10, "ttfa_p99_s": 0.20, "on_time_rate": 0.05}
SHARES = {"on_time_rate"}


def validate(names: tuple[str, ...] | None = None) -> dict:
    model, tokenizer = cpu_runs.load_model()
    fit = fit_runs(measure_runs(cpu_runs.calibration_set(), model, tokenizer))
    chosen = {n: s for n, s in cpu_runs.named(cpu_runs.VALIDATION).items() if not names or n in names}
    rows = []
    for name, scenario in chosen.items():
        # probe, run, probe, run, probe: the runs twice (their difference is the machine's noise), priced at
        # the mean machine speed of the probes around them
        speeds, runs, load = [speed(fit, model, tokenizer)], [], os.getloadavg()[0]
        for _ in range(2):
            runs.append(measure_runs({name: scenario}, model, tokenizer)[name])
            speeds.append(speed(fit, model, tokenizer))
        factor = tuple(float(np.mean(f)) for f in zip(*speeds, strict=True))
        simulated = simulate(scenario, cpu_target(fit.rescaled(*factor)))
        rows.append(compare_runs(name, runs, simulated, load, factor))
        unscaled = compare_runs(name, runs, simulate(scenario, cpu_target(fit)), load, (1.0, 1.0))
        rows[-1]["differences_unscaled"] = unscaled["differences"]
        log.info("%s: %s", name, rows[-1]["differences"])
    return {"fit": {"coefficients": fit.coefficients, **fit.about}, "rows": rows,
            "date": time.strftime("%Y-%m-%d %H:%M")}


def speed(fit: FittedCost, model, tokenizer) -> tuple[float, float]:
    """How much slower than when the fit was made the machine runs now, its products and the rest apart: the
    probe run's measured steps against the fit's two parts of the same steps (relative least squares)."""
    run = measure_runs(cpu_runs.PROBE, model, tokenizer)["cal-probe"]
    y = np.array([seconds for _, seconds in run["steps_measured"]])
    x = np.array([fit.parts(StepShape(**shape)) for shape, _ in run["steps_measured"]]) / y[:, None]
    compute, rest = nonnegative_lstsq(x, np.ones(len(y)))
    return float(compute), float(rest)


def cpu_target(fit: FittedCost) -> Priced:
    return Priced(model_shape(cpu_runs.MODEL), fit, JOB_PRICES[CPU], {"num_slabs": EngineConfig().num_slabs},
                  {"cost_model": "fitted", **fit.about}, kv_itemsize=4)


def compare_runs(name: str, runs: list[dict], simulated: dict, load: float, speed_factor: tuple[float, float]
                 ) -> dict:
    """Each figure: the measured runs' mean, the simulated value, their difference, and how far apart the
    two measured runs were (the noise a difference is to be read against)."""
    row: dict = {"scenario": name, "load_average": load, "speed_factor": speed_factor, "measured": {},
                 "simulated": {}, "differences": {}, "noise": {}}
    for part, key in FIGURES:
        if all(part in r for r in runs) and part in simulated:
            values = [r[part][key] for r in runs]
            m, s = float(np.mean(values)), simulated[part][key]
            row["measured"][key], row["simulated"][key] = m, s
            spread = max(values) - min(values)
            if key in SHARES:
                row["differences"][key], row["noise"][key] = s - m, spread
            else:
                row["differences"][key] = (s - m) / m if m else (0.0 if s == m else float("inf"))
                row["noise"][key] = spread / m if m else 0.0
    row["steps"] = {"measured": [r["steps"]["steps"] for r in runs], "simulated": simulated["steps"]["steps"]}
    return row


def print_validation(report: dict) -> None:
    print("\nthis CPU, measured (mean of two runs) vs simulated, on runs the fit never saw; diff = (sim - measured)"
          " / measured\n(the on-time share: sim - measured, in points); noise = how far apart the two measured runs"
          " were")
    print("unscaled = the same simulation with the fit as calibrated, not rescaled by the probe beside the run")
    print(f"{'scenario':14}{'figure':18}{'measured':>10}{'simulated':>11}{'diff':>8}{'unscaled':>10}{'noise':>8}"
          "  within target")
    for row in report["rows"]:
        for key, diff in row["differences"].items():
            ok = abs(diff) <= TARGETS[key]
            print(f"{row['scenario']:14}{key:18}{row['measured'][key]:10.3f}{row['simulated'][key]:11.3f}"
                  f"{diff:+8.1%}{row['differences_unscaled'][key]:+10.1%}{row['noise'][key]:8.1%}"
                  f"  {'yes' if ok else 'NO'}")
        steps = row["steps"]
        print(f"{'':14}{'steps':18}{'/'.join(map(str, steps['measured'])):>10}{steps['simulated']:11d}"
              f"   load average {row['load_average']:.1f}; time x{row['speed_factor'][0]:.2f} (products), "
              f"x{row['speed_factor'][1]:.2f} (the rest) of the fit's")
    for label, part in (("scaled by the probe", "differences"), ("unscaled", "differences_unscaled")):
        diffs = [abs(d) for row in report["rows"] for d in row[part].values()]
        within = sum(abs(d) <= TARGETS[k] for row in report["rows"] for k, d in row[part].items())
        print(f"{label}: {within} of {len(diffs)} figures within target; median |diff| {np.median(diffs):.1%}, "
              f"largest {max(diffs):.1%}")
