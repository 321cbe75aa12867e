"""What a Session needs of its client's connection, so a call can run over a websocket or elsewhere."""

from typing import Protocol


class Disconnected(Exception):
    """The client has gone: raised by `recv` and `send` of a transport."""


class Transport(Protocol):
    """The client's end of a call: a websocket connection, or the local sound devices of `voicepipe talk`.

    `recv` returns the client's next message (binary audio, a JSON text event as sent, whose size the
    session checks before parsing it, or an event a dialect already parsed and checked) and raises
    `Disconnected` once the client has gone; `send` takes an event as a dict (encoded, if at all, at the
    edge: a dialect in between reads it as it is) or binary audio, and raises `Disconnected` too when the
    client is gone; `close` ends the call from the server's side.
    """

    async def recv(self) -> str | bytes | dict: ...

    async def send(self, message: dict | bytes) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...
