"""A caller that follows a script on one websocket: its microphone streams in real time (silence between
what it says, as a real microphone sends), and it notes when each server event arrives."""

import asyncio
import json
import time
from collections.abc import Callable

import numpy as np
import websockets

from voicepipe.audio import to_pcm16
from voicepipe.protocol import ServerEvent

RATE = 16000
FRAME = RATE // 50  # 20 ms
AUDIO = "audio"  # the kind noted for a binary frame of reply audio


class ScriptedCaller:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.events: list[tuple[float, str, dict]] = []  # (when, type, event)
        self._queued = np.zeros(0, np.int16)
        self._start = time.monotonic()
        self._sent = 0  # frames sent
        self._changed = asyncio.Event()
        self._tasks = [asyncio.create_task(self._microphone()), asyncio.create_task(self._read())]

    @classmethod
    async def call(cls, url: str, turn_detection: dict | None) -> "ScriptedCaller":
        caller = cls(await websockets.connect(url, max_size=None))
        await caller.ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": turn_detection}}))
        await caller.until(lambda: caller.first(ServerEvent.SESSION_UPDATED) is not None, 30)
        return caller

    def say(self, audio: np.ndarray) -> tuple[float, float]:
        """Queue 16 kHz speech after whatever is still queued; (when its first and last samples go out)."""
        start = self._start + (self._sent * FRAME + len(self._queued)) / RATE
        self._queued = np.concatenate([self._queued, to_pcm16(audio)])
        return start, start + len(audio) / RATE

    def first(self, kind: str, after: float = 0.0) -> float | None:
        """When the first event of `kind` (AUDIO: reply audio) came after `after`."""
        return next((t for t, k, _ in self.events if k == kind and t >= after), None)

    def of(self, kind: str) -> list[dict]:
        return [e for _, k, e in self.events if k == kind]

    async def until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait for `done()` to hold (checked at each event); False if it did not within `timeout`."""
        end = time.monotonic() + timeout
        while not done():
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, end - time.monotonic()))
            except TimeoutError:
                return done()
        return True

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ws.close()

    async def _microphone(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._start + self._sent * FRAME / RATE - time.monotonic()))
            frame, self._queued = self._queued[:FRAME], self._queued[FRAME:]
            frame = np.pad(frame, (0, FRAME - len(frame)))
            await self.ws.send(frame.astype("<i2").tobytes())
            self._sent += 1
            self._changed.set()

    async def _read(self) -> None:
        async for message in self.ws:
            if isinstance(message, bytes):
                self.events.append((time.monotonic(), AUDIO, {}))
            else:
                event = json.loads(message)
                self.events.append((time.monotonic(), event["type"], event))
            self._changed.set()
