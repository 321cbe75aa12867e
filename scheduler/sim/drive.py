"""One driver for a real engine on the wall clock and a simulated one on a virtual clock.

It does what the benches' loop does (add each request when its time comes, step the engine, wait when it
has nothing to do) and what the engine's client does (hand each request's outputs and each job's result to
whoever is waiting for it), with timed callbacks in between, so a workload or a voice call written once
runs against either engine. Past saturation it stops: a request that has waited `max_wait_s` for its
first token means arrivals outrun service and the queue grows without bound.
"""

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from scheduler.engine import Engine
from scheduler.jobs import Job, JobResult
from scheduler.request import Output, Sequence

IDLE_TICK_S = 1e-3  # a step that found nothing it could run: the engine loops again this much later


class Clock(Protocol):
    def now(self) -> float: ...

    def wait_until(self, t: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Saturated:
    """Why a run stopped early: the queue was growing without bound."""

    at: float  # seconds into the run
    waited_s: float  # how long the oldest request had waited for its first token
    backlog: int  # requests still without a first token

    def __str__(self) -> str:
        return (f"saturated: at {self.at:.1f} s the oldest request had waited {self.waited_s:.0f} s for its first "
                f"token with {self.backlog} queued; arrivals outrun service, the queue grows without bound")


class Driver:
    def __init__(self, engine: Engine, clock: Clock, max_wait_s: float | None = None, check_every_s: float = 1.0):
        self.engine, self.clock, self.max_wait_s, self.check_every_s = engine, clock, max_wait_s, check_every_s
        self.start = clock.now()
        self.step_times: list[tuple[float, float]] = []  # (start, end) of each model step, driver-side
        self.host_s: list[float] = []  # wall seconds of each model step's engine work (all of it, when virtual)
        self.saturated: Saturated | None = None
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._outputs: dict[str, Callable[[Output], None]] = {}
        self._results: dict[str, Callable[[JobResult], None]] = {}
        self._next_check = self.start

    # -- what a workload does ----------------------------------------------------------------------------
    def at(self, offset_s: float, fn: Callable[[], None]) -> None:
        """Call fn at `offset_s` seconds into the run (at once if that time has passed)."""
        heapq.heappush(self._events, (self.start + offset_s, next(self._order), fn))

    def add_request(self, seq: Sequence, on_output: Callable[[Output], None] | None = None) -> Sequence:
        if on_output is not None:
            self._outputs[seq.request_id] = on_output
        return self.engine.add_request(seq)

    def submit_job(self, job: Job, on_result: Callable[[JobResult], None]) -> None:
        self._results[job.job_id] = on_result
        self.engine.submit_job(job)

    def now(self) -> float:
        """Seconds into the run."""
        return self.clock.now() - self.start

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> None:
        """Until nothing is left to do, or the queue is found to grow without bound."""
        engine = self.engine
        while True:
            now = self.clock.now()
            while self._events and self._events[0][0] <= now:
                heapq.heappop(self._events)[2]()
            steps, started, wall = engine.metrics.steps_run, self.clock.now(), time.perf_counter()
            if engine.step():
                stepped = engine.metrics.steps_run > steps
                if stepped:
                    self.host_s.append(time.perf_counter() - wall)
                    self.step_times.append((started, self.clock.now()))
                if not self._deliver() and not stepped:  # nothing could run: the engine loops a moment later
                    self.clock.wait_until(self.clock.now() + IDLE_TICK_S)
                if self._stalled():
                    return
            elif self._events:
                self.clock.wait_until(self._events[0][0])
            else:
                return

    def _deliver(self) -> bool:
        outputs, results, _ = self.engine.take_outputs()
        for request_id, output in outputs:
            listener = self._outputs.pop(request_id, None) if output.finished else self._outputs.get(request_id)
            if listener is not None:
                listener(output)
        for result in results:
            listener = self._results.pop(result.job_id, None)
            if listener is not None:
                listener(result)
        return bool(outputs or results)

    def _stalled(self) -> bool:
        now = self.clock.now()
        if self.max_wait_s is None or now < self._next_check:
            return False
        self._next_check = now + self.check_every_s
        waiting = [now - s.arrival for s in self.engine.planner.sequences if s.first_token_at is None]
        if waiting and max(waiting) > self.max_wait_s:
            self.saturated = Saturated(now - self.start, max(waiting), len(waiting))
            return True
        return False
