"""The simulator against the real engine on this CPU: a run the fit never saw, measured and simulated.

The fit is this machine's own (made here on first use and cached), never one made on another machine: the
CPU kinds this runs on differ 2.5-3.5x in speed. Slow (it builds SmolLM2-135M's shape and measures runs).
The bound is loose on purpose: the cores are shared; `voicepipe simulate validate` is the full table with its noise.
"""

import pytest

from voicepipe.simulate import cpu_runs
from voicepipe.simulate.calibrate import machine_fit
from voicepipe.simulate.costs import CPU, JOB_PRICES, machine_fit_path, priced
from voicepipe.simulate.run import measure, simulate

pytestmark = pytest.mark.slow


def test_this_machines_fit_predicts_a_run_it_never_saw():
    fit = machine_fit()
    assert fit.about["machine"] and machine_fit_path().exists()
    scenario = cpu_runs.VALIDATION["fcfs"]
    model, tokenizer = cpu_runs.load_model()
    measured = measure(scenario, model, tokenizer, JOB_PRICES[CPU], **cpu_runs.engine_fields())
    simulated = simulate(scenario, priced(CPU, cpu_runs.MODEL, cpu_runs.PRECISION, fit=machine_fit_path()))
    assert simulated["steps"]["steps"] == measured["steps"]["steps"]  # all at once: the same plans
    for key in ("throughput_tok_s", "ttft_p50_s", "latency_p50_s"):
        assert simulated["text"][key] == pytest.approx(measured["text"][key], rel=0.35), key
    # what a fit reads: every model step, with its shape
    assert len(measured["steps_measured"]) == measured["steps"]["steps"]
    assert all(seconds > 0 for _, seconds in measured["steps_measured"])
