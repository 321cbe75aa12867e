"""One scenario (policy, knobs, text traffic, calls) run on a simulated engine or measured on the real one.

Both go through the same driver, the same traffic and the same figures, so a difference between the two
is the cost model's (or the machine's noise), not the harness's. A measured run uses the real engine on a
random-weight model of the named shape, timed by the engine thread's own CPU time (the cores are shared),
its calls' ASR and TTS jobs standing in at their price (what is measured is the engine; the job prices are
DESIGN.md's).
"""

import time
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler import EngineConfig, RequestClass
from scheduler.sim import Driver, RecordingRunner, ThreadClock, VirtualClock, WallClock, priced_handler, virtual_engine
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.shapes import IdTokenizer
from voicepipe.bench.workload import WorkItem
from voicepipe.simulate.calls import CallLoad, priced_jobs, start_calls
from voicepipe.simulate.costs import JobPrices, Priced
from voicepipe.simulate.figures import call_figures, step_figures, text_figures, within_slo
from voicepipe.simulate.text import TextLoad, submit_text


@dataclass(frozen=True)
class Scenario:
    policy: str = "o4"
    knobs: dict[str, int] = field(default_factory=dict)  # max_batch_tokens, max_batch_seqs
    text: TextLoad | None = None
    text_class: RequestClass = RequestClass.INTERACTIVE
    calls: CallLoad | None = None
    engine: dict[str, Any] = field(default_factory=dict)  # other EngineConfig fields (static_batch_size, ...)
    slo: tuple[float, float] = (2.0, 0.1)  # (TTFT s, TPOT s) a request must meet to count in goodput
    max_wait_s: float | None = 60.0  # a request waiting this long for its first token: saturated, stop
    name: str = ""

    def config(self, pool: dict[str, Any], **fields: Any) -> EngineConfig:
        return EngineConfig(policy=self.policy, **{**self.knobs, **pool, **self.engine, **fields})

    def describe(self) -> dict:
        return {"name": self.name, "policy": self.policy, "knobs": self.knobs, "engine": self.engine,
                "text": self.text.describe() if self.text else None, "text_class": self.text_class.name,
                "calls": self.calls.describe() if self.calls else None,
                "slo": {"ttft_s": self.slo[0], "tpot_s": self.slo[1]}}

    def with_(self, **changes: Any) -> "Scenario":
        return replace(self, **changes)


def simulate(scenario: Scenario, priced: Priced, items: list[WorkItem] | None = None) -> dict:
    """The scenario on the real engine core, priced, in virtual time (`items`: text requests of a trace,
    instead of the scenario's)."""
    clock = VirtualClock()
    engine = virtual_engine(priced.shape, scenario.config(priced.pool), priced.cost, IdTokenizer(priced.shape.vocab),
                            priced_jobs(priced.jobs), priced.kv_itemsize, clock)
    wall = time.perf_counter()
    report = _drive(engine, clock, scenario, priced.shape.vocab, priced.jobs, lambda: engine.runner.steps, items)
    report["wall_s"] = time.perf_counter() - wall
    # The engine's own host work per step here (planning, bookkeeping, outputs), which the price leaves out:
    # on a GPU it must hide under the device's step (the engine overlaps planning with the step on CUDA).
    host = report.pop("host_s")
    report["steps"].update({"host_p50_ms": 1e3 * percentile(host, 50), "host_p99_ms": 1e3 * percentile(host, 99)})
    report["priced"] = priced.about
    return report


def measure(scenario: Scenario, model: Any, tokenizer: Any, prices: JobPrices, clock: Any = None,
            **config: Any) -> dict:
    """The scenario on the real engine over `model`; `steps_measured` holds each model step's shape and time,
    what a fit reads. The clock is the engine thread's CPU time (`ThreadClock`) unless one is given: on cores
    other work shares, that is the time the steps took this machine, not the time the others took."""
    clock = clock or ThreadClock()
    jobs = {kind: priced_handler(job, _StandIn(clock)) for kind, job in priced_jobs(prices).items()}
    from scheduler import Engine
    from scheduler.model.runner import ModelRunner

    engine_config = scenario.config({}, **config)
    runner = RecordingRunner(ModelRunner(model, engine_config))
    engine = Engine(model, tokenizer, engine_config, jobs, runner=runner, clock=clock.now)
    _warm_up(engine, runner)
    driver_steps: list = []

    def steps() -> list:
        return list(zip(runner.shapes, (t1 - t0 for t0, t1 in driver_steps), strict=False))

    report = _drive(engine, clock, scenario, model.config.vocab_size, prices, steps, step_times=driver_steps)
    report["steps_measured"] = [(shape.as_dict(), seconds) for shape, seconds in steps()]
    del report["host_s"]
    return report


def _drive(engine, clock, scenario: Scenario, vocab: int, prices: JobPrices, steps,
           items: list[WorkItem] | None = None, step_times: list | None = None) -> dict:
    driver = Driver(engine, clock, scenario.max_wait_s)
    if step_times is not None:
        driver.step_times = step_times
    if items is None and scenario.text:
        items = scenario.text.items(vocab)
    seqs = submit_text(driver, items, scenario.text_class) if items else []
    calls = start_calls(driver, scenario.calls, prices, vocab) if scenario.calls else []
    driver.run()
    end = driver.clock.now()
    report: dict = {"scenario": scenario.describe(), "duration_s": end - driver.start, "host_s": driver.host_s,
                    "saturated": str(driver.saturated) if driver.saturated else None,
                    "steps": step_figures(steps())}
    if items:
        report["text"] = text_figures(seqs, driver.start, end)
        report["text"]["within_slo"] = within_slo(seqs, *scenario.slo)
    if calls:
        report["calls"] = call_figures(calls)
    return report


def _warm_up(engine, runner: RecordingRunner) -> None:
    """A first short request through the engine, unrecorded: a process's first steps pay one-time costs."""
    from scheduler import SamplingParams, Sequence

    engine.add_request(Sequence([5] * 40, SamplingParams(max_tokens=4, ignore_eos=True), request_id="warm-up"))
    while engine.step():
        pass
    engine.take_outputs()
    runner.shapes.clear()


class _StandIn:
    """Holds the engine for a job's price, as the device work it stands for would: asleep on the wall clock,
    or moving a work-counting clock on."""

    def __init__(self, clock: WallClock | ThreadClock | VirtualClock) -> None:
        self.clock = clock

    def advance(self, seconds: float) -> None:
        if isinstance(self.clock, WallClock):
            time.sleep(seconds)
        else:
            self.clock.advance(seconds)
