"""Stages and the pipeline that links them: one asyncio queue and one task per stage.

A stage's `process` must return quickly: device work (an ASR pass, a TTS sentence, an LLM stream) runs in
a task the stage spawns, never inside `process`. That keeps every queue nearly empty, so a barge-in passes
from the VAD to the audio output in milliseconds while events keep their order.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from scheduler.channel.client import EngineUnavailable
from voicepipe.pipeline.events import Error, Event, Feedback

log = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S", bound="Stage")


class Stage:
    """One step of a call: handles the events it knows in `process`, passes on the rest with `emit`;
    takes the feedback it acts on in `feedback` and sends its own upstream with `emit_upstream`."""

    def __init__(self) -> None:
        self._emit: Callable[[Event], None] = lambda event: None
        self._emit_up: Callable[[Feedback], None] = lambda event: None
        self._spawn: Callable[[Coroutine], asyncio.Task] = asyncio.create_task

    async def process(self, event: Event) -> None:
        self.emit(event)

    async def feedback(self, event: Feedback) -> bool:
        """Act on feedback from a later stage; False passes it on to the stage before."""
        return False

    def emit(self, event: Event) -> None:
        """Send an event to the next stage (dropped after the last one)."""
        self._emit(event)

    def emit_upstream(self, event: Feedback) -> None:
        """Send feedback to the stage before (dropped before the first one)."""
        self._emit_up(event)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> "asyncio.Task[T]":
        """Start a task the pipeline owns: it is cancelled and awaited when the call ends."""
        return self._spawn(coro)


class Pipeline:
    """The stages of one call, written as a list and run in order."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = stages
        self.queues: list[asyncio.Queue[Event]] = [asyncio.Queue() for _ in stages]
        self.tasks: set[asyncio.Task] = set()
        for stage, downstream in zip(stages, self.queues[1:], strict=False):
            stage._emit = downstream.put_nowait
        for stage, upstream in zip(stages[1:], self.queues, strict=False):
            stage._emit_up = upstream.put_nowait
        for stage in stages:
            stage._spawn = self._spawn

    def start(self) -> None:
        for stage, queue in zip(self.stages, self.queues, strict=True):
            self._spawn(self._run(stage, queue))

    def stage(self, kind: type[S]) -> S:
        """The call's stage of type `kind`."""
        return next(stage for stage in self.stages if isinstance(stage, kind))

    def push(self, event: Event) -> None:
        """Feed an event to the first stage."""
        self.queues[0].put_nowait(event)

    async def stop(self) -> None:
        """Cancel every task of the call (stage loops and the work they spawned) and wait for them."""
        while self.tasks:
            tasks = list(self.tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.tasks.difference_update(tasks)

    def _spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        if isinstance(task.exception(), EngineUnavailable):  # not a bug here: the engine is restarting
            log.warning("a turn's device work was lost with the engine: %s", task.exception())
            self.queues[-1].put_nowait(Error("engine_unavailable", "the engine is restarting; speak again in a few "
                                             "seconds", "server_error"))
            return
        log.error("pipeline task failed", exc_info=task.exception())
        self.queues[-1].put_nowait(Error("internal_error", "the server hit an internal error", "server_error"))

    async def _run(self, stage: Stage, queue: asyncio.Queue[Event]) -> None:
        while True:
            event = await queue.get()
            try:
                if not isinstance(event, Feedback):
                    await stage.process(event)
                elif not await stage.feedback(event):
                    stage.emit_upstream(event)
            except Exception:  # one bad event must not end the call
                log.exception("%s failed on %s", type(stage).__name__, type(event).__name__)
                self.queues[-1].put_nowait(Error("internal_error", "the server hit an internal error",
                                                 "server_error"))
            if not queue.empty():  # a burst (a client's thousand messages): the loop's other work goes between
                await asyncio.sleep(0)

