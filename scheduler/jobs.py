"""Device jobs: the ASR passes and TTS sentences that run in the engine between model steps.

A job is data, not a closure: a kind that names a handler registered with the engine, and its arguments.
That is what lets a job cross into the engine process. A job's key is (tier, deadline, arrival order):
realtime jobs share the top tier (PRESSING_TIER) with pressing decodes, so the engine can weigh a job against the
model's own work with `StepPlanner.urgency`. A handler may take jobs in batches: queued jobs of its kind
then run together (several callers' final ASR passes in one encoder call).
"""

import heapq
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.request import PRESSING_TIER, RequestClass

_job_ids = itertools.count()


@dataclass(frozen=True)
class JobHandler:
    """What runs a kind of job. With `batch` > 1, `fn` takes a list of argument tuples and returns a list
    of results, one each, and up to `batch` queued jobs of the kind run in one call."""

    fn: Callable[..., Any]
    batch: int = 1


@dataclass(order=True)
class Job:
    """A device call waiting for its turn in the engine."""

    key: tuple
    job_id: str = field(compare=False)
    kind: str = field(compare=False)
    args: tuple = field(compare=False)
    queued_at: float = field(default=0.0, compare=False)  # the engine's clock when it was queued


def make_job(kind: str, args: tuple, cls: RequestClass = RequestClass.INTERACTIVE, deadline: float | None = None,
             job_id: str | None = None) -> Job:
    tier = PRESSING_TIER if cls is RequestClass.REALTIME else int(cls)
    order = next(_job_ids)
    return Job((tier, math.inf if deadline is None else deadline, order), job_id or f"job-{order}", kind,
               tuple(args))


@dataclass(slots=True)
class JobResult:
    job_id: str
    kind: str
    value: Any = None
    error: str | None = None  # the handler's exception, as one line: it crosses processes as text
    seconds: float = 0.0


class JobQueue:
    """The jobs waiting, most urgent first: filled by the engine's thread, emptied by it or by the job lane's
    (hence the lock)."""

    def __init__(self) -> None:
        self._heap: list[Job] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, job: Job) -> None:
        with self._lock:
            heapq.heappush(self._heap, job)

    def cancel(self, job_id: str) -> None:
        """Drop a job that has not started (its caller stopped waiting); unknown ids are ignored. The queue
        holds a handful of jobs, so a scan is the cheap way."""
        with self._lock:
            kept = [job for job in self._heap if job.job_id != job_id]
            if len(kept) != len(self._heap):
                self._heap = kept
                heapq.heapify(kept)

    def first_key(self, now: float, aging_s: float) -> tuple:
        """(tier, deadline) of the most urgent job, its tier climbing one class per `aging_s` it has waited,
        as a waiting request's does: a job below the realtime tier is weighed against model work that ages,
        and would otherwise wait for as long as older requests keep arriving."""
        job = self._heap[0]
        tier, deadline = job.key[:2]
        if tier > 0:
            tier = max(0, tier - int((now - job.queued_at) / aging_s))
        return tier, deadline

    def take(self, handlers: dict[str, JobHandler]) -> tuple[list[Job], JobHandler] | None:
        """The most urgent job, with up to its handler's `batch` - 1 more of its kind in their own order, and
        that handler; None when none waits."""
        with self._lock:
            if not self._heap:
                return None
            first = heapq.heappop(self._heap)
            handler = handlers[first.kind]
            same = sorted(job for job in self._heap if job.kind == first.kind)[:handler.batch - 1]
            if same:
                taken = {id(job) for job in same}
                self._heap = [job for job in self._heap if id(job) not in taken]
                heapq.heapify(self._heap)
            return [first, *same], handler
