"""Where device jobs run: between the model's steps on the engine's own thread, or on a lane of their own
beside them.

One at a time was right while the engine shared a process with the server: a job thread there waited for the
interpreter lock at every step of the server's. In a process of its own, the engine's jobs (a Whisper pass
in CTranslate2, a Piper sentence in onnxruntime) release the lock while they compute, so a second thread can
run them on a core the model's steps leave idle. Jobs still start most urgent first (the queue's order by
class and deadline); on a lane they no longer wait for a model step to end, nor make one wait.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from scheduler.jobs import Job, JobHandler, JobResult

log = logging.getLogger(__name__)
Batch = tuple[list[Job], JobHandler]
Refill = Callable[[], Batch | None]  # the next batch waiting, taken off the queue; None when none waits
Timer = Callable[[], float]


def run_jobs(jobs: list[Job], handler: JobHandler, timer: Timer) -> list[JobResult]:
    """Run a batch of one kind; a handler's exception is each job's error, never raised."""
    t0 = timer()
    try:
        values = handler.fn([j.args for j in jobs]) if handler.batch > 1 else [handler.fn(*jobs[0].args)]
        errors: list[str | None] = [None] * len(jobs)
    except Exception as exc:  # the callers get the error; the engine goes on
        log.warning("device job %s failed: %s", jobs[0].kind, exc)
        values, errors = [None] * len(jobs), [f"{type(exc).__name__}: {exc}"] * len(jobs)
    seconds = timer() - t0
    return [JobResult(j.job_id, j.kind, v, e, seconds) for j, v, e in zip(jobs, values, errors, strict=True)]


class JobLane(Protocol):
    """`beside`: whether jobs run while model steps do. `start` hands over a batch (only while not `busy`);
    a lane beside the steps takes the next batch waiting itself (`refill`, which the engine sets) once it
    ends; `take` returns the results finished since; `wait` blocks until the running batch ends, or
    `timeout_s`."""

    beside: bool
    refill: Refill

    @property
    def busy(self) -> bool: ...

    def start(self, jobs: list[Job], handler: JobHandler) -> None: ...

    def take(self) -> list[JobResult]: ...

    def wait(self, timeout_s: float) -> None: ...

    def close(self) -> None: ...


class InlineLane:
    """Jobs on the engine's thread, between model steps: each holds the device until it ends."""

    beside = False
    busy = False

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.refill: Refill = lambda: None  # the engine decides between steps whether a job goes next
        self._done: list[JobResult] = []

    def start(self, jobs: list[Job], handler: JobHandler) -> None:
        self._done += run_jobs(jobs, handler, self.timer)

    def take(self) -> list[JobResult]:
        done, self._done = self._done, []
        return done

    def wait(self, timeout_s: float) -> None:
        """Nothing runs beside the engine: nothing to wait for."""

    def close(self) -> None:
        """No thread to stop."""


class ThreadLane:
    """Jobs on a thread of their own, one batch at a time, beside the model's steps. The engine starts a
    batch when it finds the lane free between steps; once started, the lane takes the next batch waiting
    itself (`refill`), so it is not left idle until the step in flight ends."""

    beside = True

    def __init__(self) -> None:
        self.refill: Refill = lambda: None
        self._todo: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._done: list[JobResult] = []
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._work, name="voicepipe-jobs", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def start(self, jobs: list[Job], handler: JobHandler) -> None:
        self._idle.clear()
        self._todo.put((jobs, handler))

    def take(self) -> list[JobResult]:
        with self._lock:
            done, self._done = self._done, []
        return done

    def wait(self, timeout_s: float) -> None:
        self._idle.wait(timeout_s)

    def close(self) -> None:
        self._todo.put(None)
        self._thread.join(timeout=30)

    def _work(self) -> None:
        while (batch := self._todo.get()) is not None:
            while batch is not None:
                results = run_jobs(*batch, time.perf_counter)
                with self._lock:
                    self._done += results
                batch = self.refill()
            self._idle.set()
