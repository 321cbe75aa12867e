"""A request body is refused past `max_bytes`, before anything parses it: a stated length at once, a
chunked body as soon as it passes the limit (the parser never sees more)."""

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
        too_long = stated.isdigit() and int(stated) > self.max_bytes  # refused before a byte of it is read
        taken = 0

        async def counted() -> Message:
            nonlocal taken
            if too_long:
                raise BodyTooLarge(self.max_bytes)
            message = await receive()
            taken += len(message.get("body", b""))
            if taken > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)
