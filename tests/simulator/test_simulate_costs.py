"""The simulator's clocks and its recalibration: a work-counting clock for a real engine on shared cores,
a fit's rescaling, the roofline's efficiencies fitted back from step times they priced, and when this
machine's cached fit is made again."""

import time
from pathlib import Path

import pytest

from scheduler.sim import DEVICES, DTYPES, Efficiency, FittedCost, ModelShape, Roofline, StepShape, ThreadClock
from scheduler.sim.efficiency_fit import fit_efficiency
from voicepipe.bench.shapes import SHAPES
from voicepipe.simulate.public import decode_step, prefill_step

THIRTEEN_B = ModelShape.from_config("llama-2-13b", SHAPES["13b"])


def test_thread_clock_counts_work_not_sleep_and_jumps_when_waiting():
    clock = ThreadClock()
    start = clock.now()
    time.sleep(0.2)  # another process's turn on the core, as far as this thread can tell
    assert clock.now() - start < 0.05
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:
        pass  # work
    assert clock.now() - start >= 0.05
    clock.wait_until(start + 10.0)
    assert clock.now() == pytest.approx(start + 10.0, abs=1e-3)
    clock.advance(2.0)  # a priced job
    assert clock.now() == pytest.approx(start + 12.0, abs=1e-3)


def test_rescaling_a_fit_moves_its_products_and_the_rest_apart():
    fit = FittedCost({"const": 0.03, "tokens": 0.002, "seqs": 0.001, "attention_pairs": 1e-6, "context_tokens": 1e-6})
    prompt = prefill_step(100)
    compute, rest = fit.parts(prompt)
    assert compute == pytest.approx(100 * 0.002 + 5050 * 1e-6) and compute + rest == pytest.approx(
        fit.step_seconds(prompt))
    slower = fit.rescaled(compute=1.1, rest=1.5)
    assert slower.step_seconds(prompt) == pytest.approx(1.1 * compute + 1.5 * rest)
    assert slower.coefficients["const"] == pytest.approx(0.045)
    assert slower.coefficients["tokens"] == pytest.approx(0.0022)


def test_efficiencies_are_fitted_back_from_the_step_times_they_priced():
    truth = Efficiency(mfu=0.55, mbu=0.81, overhead_s=2.5e-3)
    priced = Roofline(THIRTEEN_B, DEVICES["h100"], DTYPES["fp16"], truth)
    steps = [decode_step(b, c) for b in (1, 8, 32, 96) for c in (128, 900, 2000)]
    steps += [prefill_step(n) for n in (256, 1024, 2048)] + [StepShape(2048 + 40, 41, 41, 40, 2048, 4_000_000, 60_000)]
    seconds = [priced.step_seconds(s) for s in steps]
    fitted, info = fit_efficiency(Roofline(THIRTEEN_B, DEVICES["h100"], DTYPES["fp16"]), steps, seconds)
    assert fitted.mfu == pytest.approx(0.55, abs=0.01) and fitted.mbu == pytest.approx(0.81, abs=0.01)
    assert fitted.overhead_s == pytest.approx(2.5e-3, abs=3e-4)
    assert info["relative_error_p90"] < 0.01


def test_a_cached_fit_made_on_a_busier_machine_is_made_again_and_one_made_alike_is_kept(tmp_path, monkeypatch):
    from voicepipe.simulate import calibrate as calibration

    path = tmp_path / "fit.json"
    FittedCost({"base_s": 0.01}, {"load_before": 2.5}).save(path)
    made: list[Path] = []

    def refit(where: Path) -> FittedCost:
        made.append(where)
        return FittedCost({"base_s": 0.005}, {"load_before": 0.1})

    monkeypatch.setattr(calibration, "machine_fit_path", lambda: path)
    monkeypatch.setattr(calibration, "calibrate", refit)
    monkeypatch.setattr(calibration.os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    assert calibration.machine_fit().coefficients == {"base_s": 0.01} and not made  # as busy as it was
    monkeypatch.setattr(calibration.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert calibration.machine_fit().coefficients == {"base_s": 0.005} and made == [path]  # quieter now
