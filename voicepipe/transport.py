"""What a Session needs of its client's connection, so a call can run over a websocket or elsewhere."""

from typing import Protocol


class Disconnected(Exception):
    """The client has gone: raised by `recv` and `send` of a transport."""


class Transport(Protocol):
    """The client's end of a call: a websocket connection, or the local sound devices of `voicepipe talk`.

    `recv` returns the client's next message (binary audio or a JSON text event) and raises
    `Disconnected` once the client has gone; `send` raises it too when the client is gone; `close` ends
    the call from the server's side.
    """

    async def recv(self) -> str | bytes: ...

    async def send(self, message: str | bytes) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...
