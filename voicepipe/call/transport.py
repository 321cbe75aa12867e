"""What a session talks to: its client's end of the call, in the session's own terms both ways.

In, the client's audio (PCM16 at 16 kHz) and its events as the native protocol names and shapes them (a
client event becomes a pipeline request only with the call's state: its settings, tools and MCP servers,
which the session holds). Out, the pipeline's typed events. A websocket's wire format is a `Serializer`,
one per format, which the transport calls both ways; lines in this process (`talk`, a SIP call) read the
events themselves.
"""

import asyncio
from typing import Protocol

from voicepipe.call.client_events import ClientError
from voicepipe.pipeline.events import Error, Event
from voicepipe.protocol.transport import Line, Refused

Inbound = bytes | dict  # the caller's audio, or a client event in the native protocol's shape


class Transport(Protocol):
    """`recv` returns what the client sent next and raises `Disconnected` once it has gone; `send` tells it
    of an event (one it need not hear of is dropped), and raises `Disconnected` too when it is gone;
    `close` ends the call from the server's side."""

    async def recv(self) -> Inbound: ...

    async def send(self, event: Event) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class Serializer(Protocol):
    """One wire format. `parse` reads one message of the client's (None: nothing for the session; a
    `ClientError` for one it refuses, which the client is told of; `Refused` or `Disconnected` where the
    format says the call ends); `render` gives the messages an event reads as (none: the client does not
    hear of it)."""

    def parse(self, message: str | bytes) -> Inbound | None: ...

    def render(self, event: Event) -> list[dict | bytes]: ...


class SerializedLine:
    """A websocket line as a session's transport, in the wire format `serializer` speaks."""

    def __init__(self, line: Line, serializer: Serializer) -> None:
        self.line, self.serializer = line, serializer
        self._lock = asyncio.Lock()  # an event's messages go out together (an audio delta next to its frame)

    async def recv(self) -> Inbound:
        while True:
            message = await self.next_message()
            try:
                inbound = self.serializer.parse(message)
            except ClientError as e:
                await self.send(Error(e.code, str(e), event_id=e.event_id, param=e.param))
                continue
            except Refused as e:
                await self.line.close(e.code, e.reason)
                raise
            if inbound is not None:
                return inbound

    async def next_message(self) -> str | bytes:
        """The line's next message (where the format has a deadline for it, a subclass keeps it)."""
        return await self.line.recv()

    async def send(self, event: Event) -> None:
        async with self._lock:
            for message in self.serializer.render(event):
                await self.line.send(message)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.line.close(code, reason)
