"""How late the server's event loop runs what it was asked to run: the one figure that says whether any
client's work (a huge message, a long render, a slow parse) is holding every other call back.

A callback is scheduled every `interval_s`; the lag is how long after its due time it ran. A loop that
keeps up runs it within a millisecond or two; a loop blocked for 2 s by one request shows a 2 s lag.
"""

import asyncio

from prometheus_client import Histogram

INTERVAL_S = 0.1


class LoopLag:
    """Samples the running loop's lag into `histogram` from `start` until `stop`; `worst` is the largest
    lag seen since the last `take_worst`."""

    def __init__(self, histogram: Histogram, interval_s: float = INTERVAL_S) -> None:
        self.histogram, self.interval_s = histogram, interval_s
        self.worst = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def take_worst(self) -> float:
        """The largest lag since the last call (and start again from nothing)."""
        worst, self.worst = self.worst, 0.0
        return worst

    def _schedule(self) -> None:
        due = self._loop.time() + self.interval_s
        self._handle = self._loop.call_at(due, self._tick, due)

    def _tick(self, due: float) -> None:
        lag = max(0.0, self._loop.time() - due)
        self.histogram.observe(lag)
        self.worst = max(self.worst, lag)
        self._schedule()
