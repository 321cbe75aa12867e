"""A request body is refused past `max_bytes`, before anything parses it: a stated length on its first
read, a chunked body as soon as it passes the limit (the parser never sees more).

The rest of a refused body is read and thrown away (up to `DRAIN_FACTOR` times the limit) before the
refusal goes out: a server that answers and closes while the client is still writing makes the client's
kernel reset the connection, and the client never reads the 413 (measured: a 1 MiB body got a reset)."""

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_FACTOR = 16  # a body larger than this many times the limit is not read at all: its client gets a reset


class BodyTooLarge(HTTPException):
    """Raised into whoever reads the body; the app's error handlers answer it in OpenAI's shape."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than {max_bytes} bytes")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stated = dict(scope["headers"]).get(b"content-length", b"")
        too_long = stated.isdigit() and int(stated) > self.max_bytes
        taken = 0

        async def counted() -> Message:
            nonlocal taken
            message = await receive()
            taken += len(message.get("body", b""))
            if too_long or taken > self.max_bytes:
                while message.get("more_body") and taken <= DRAIN_FACTOR * self.max_bytes:
                    message = await receive()
                    taken += len(message.get("body", b""))
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)
