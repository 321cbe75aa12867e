"""Device jobs: the ASR passes and TTS sentences that run on the engine thread between model steps.

A job's key is (tier, deadline, arrival order): realtime jobs share the top tier (-1) with pressing
decodes, so the engine can weigh a job against the model's own work with `StepPlanner.urgency`.
"""

import asyncio
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler.request import RequestClass

log = logging.getLogger(__name__)


def notify(loop: asyncio.AbstractEventLoop, fn: Callable, *args: Any) -> None:
    """Hand a result to a caller's event loop; a caller whose loop has closed just stops listening."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        log.debug("dropped a result for a closed event loop")


@dataclass(order=True)
class Job:
    """A device call waiting for its turn on the engine loop."""

    key: tuple
    fn: Callable = field(compare=False)
    kind: str = field(compare=False)
    cls: RequestClass = field(compare=False)
    arrival: float = field(compare=False)
    done: Callable[[Any, BaseException | None], None] = field(compare=False)

    def run(self) -> float:
        """Call the job and hand its result (or error) back; returns the seconds it took."""
        t0 = time.monotonic()
        try:
            result, error = self.fn(), None
        except Exception as exc:  # the caller gets the error; the loop goes on
            result, error = None, exc
        seconds = time.monotonic() - t0
        self.done(result, error)
        return seconds


class JobQueue:
    """The jobs waiting, most urgent first (touched by the engine thread only)."""

    def __init__(self) -> None:
        self._heap: list[Job] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def make(self, fn: Callable[[], Any], cls: RequestClass, deadline: float | None, kind: str,
             loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> Job:
        """A job whose result settles `future` on `loop` (unless the caller has stopped waiting)."""
        def done(result: Any, error: BaseException | None) -> None:
            def settle() -> None:
                if future.cancelled():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            notify(loop, settle)

        tier = -1 if cls is RequestClass.REALTIME else int(cls)
        return Job((tier, deadline or math.inf, next(self._order)), fn, kind, cls, time.monotonic(), done)

    def push(self, job: Job) -> None:
        heapq.heappush(self._heap, job)

    def first_key(self) -> tuple:
        """(tier, deadline) of the most urgent job."""
        return self._heap[0].key[:2]

    def pop(self) -> Job:
        return heapq.heappop(self._heap)
