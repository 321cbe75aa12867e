"""A client's end of a call held in memory: a websocket `Line` for driving a `Session` in a wire format
without a socket, so their edge cases run in milliseconds."""

import asyncio
import json
import time

from voicepipe.call.limits import Limits
from voicepipe.call.native_serializer import NativeSerializer
from voicepipe.call.runtime import Runtime
from voicepipe.call.transport import SerializedLine
from voicepipe.protocol.transport import Disconnected
from voicepipe.server.realtime import RealtimeSerializer

GONE = object()


class QueueTransport:
    """What a test `put`s is received in order; what the server sends is kept in `sent`, as sent.
    `leave()` is the client vanishing; `close` the server ending the call."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.sent: list[dict | bytes] = []
        self.closed: tuple[int, str] | None = None
        self._arrived = asyncio.Event()

    # -- the Line the server sees ------------------------------------------------------------------------
    async def recv(self) -> str | bytes:
        message = await self.inbox.get()
        if message is GONE:
            raise Disconnected
        return message

    async def send(self, message: dict | bytes) -> None:
        if self.closed is not None:
            raise Disconnected
        self.sent.append(message)
        self._arrived.set()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)
        self.inbox.put_nowait(GONE)

    # -- the test's side ---------------------------------------------------------------------------------
    def put(self, *messages: dict | str | bytes) -> None:
        """Messages from the client: dicts go as JSON text, as a websocket carries them."""
        for message in messages:
            self.inbox.put_nowait(json.dumps(message) if isinstance(message, dict) else message)

    def leave(self) -> None:
        self.inbox.put_nowait(GONE)

    def events(self, kind: str | None = None) -> list[dict]:
        return [m for m in self.sent if isinstance(m, dict) and kind in (None, m.get("type"))]

    async def until(self, kind: str, count: int = 1, timeout: float = 5.0) -> dict:
        """The `count`-th event of `kind` the server sent, once it has."""
        end = time.monotonic() + timeout
        while len(self.events(kind)) < count:
            self._arrived.clear()
            left = end - time.monotonic()
            assert left > 0, f"no {kind} in {[e.get('type') for e in self.events()]}"
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                pass
        return self.events(kind)[count - 1]


def native(client: QueueTransport, limits: Limits | None = None) -> SerializedLine:
    """`client` as a session's transport speaking the native protocol."""
    return SerializedLine(client, NativeSerializer((limits or Limits()).max_message_bytes))


def realtime(client: QueueTransport, runtime: Runtime, limits: Limits | None = None, beta: bool = False
             ) -> SerializedLine:
    """`client` as a session's transport speaking the Realtime API (the beta where asked)."""
    return SerializedLine(client, RealtimeSerializer(runtime, (limits or Limits()).max_message_bytes, beta))
