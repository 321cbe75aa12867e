"""A client's connection as the wire sees it: messages of text (or a JSON object) and binary frames."""

from typing import Protocol


class Disconnected(Exception):
    """The client has gone: raised by `recv` and `send` of a line or a transport."""


class Refused(Disconnected):
    """The client may not go on (a phone stream without the API key, or in a codec not spoken here): the
    line is closed with `code` and `reason`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class Line(Protocol):
    """A websocket connection, as a call uses it: `recv` returns the client's next message (text or binary)
    and raises `Disconnected` once the client has gone; `send` takes a JSON event (a dict, encoded at the
    edge) or a binary frame and raises `Disconnected` too when the client is gone; `close` ends it from the
    server's side."""

    async def recv(self) -> str | bytes: ...

    async def send(self, message: dict | bytes) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...
