"""The engine on a thread of this process, stepped by the same driver as the engine process's."""

import logging
import queue
import threading
from collections.abc import Iterable
from typing import Any

from scheduler.channel import driver
from scheduler.channel import messages as m
from scheduler.channel.client import EngineClient
from scheduler.engine import Engine

log = logging.getLogger(__name__)


class LocalEngine(EngineClient):
    """The engine on a thread of this process: what the notebook, unit tests and small scripts use, with
    the engine itself at hand as `core` (its planner and pool, to look at between steps)."""

    def __init__(self, engine: Engine, info: dict[str, Any] | None = None) -> None:
        super().__init__(engine.config, {"max_context": engine.max_context, **(info or {})})
        self.core = engine
        self._inbox: queue.SimpleQueue[m.Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="voicepipe-engine", daemon=True)
            self._thread.start()
            self._resume()

    async def stop(self) -> None:
        if self._thread is not None:
            self._inbox.put(m.Shutdown())
            self._thread.join()
            self._thread = None
            self._lost("the engine was stopped")

    def _send(self, command: m.Command) -> None:
        self._inbox.put(command)

    def _serve(self) -> None:
        driver.run(self.core, self._take, self._deliver)

    def _take(self, block: bool) -> Iterable[m.Command]:
        commands = [self._inbox.get()] if block else []
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _deliver(self, event: m.Event) -> None:
        loop = self._loop
        if loop is None:
            return  # nobody has asked for anything that answers
        try:
            loop.call_soon_threadsafe(self._receive, event)
        except RuntimeError:
            log.debug("dropped an engine event for a closed event loop")
