"""A middleware for Ray Serve's HTTP proxy: a call whose replica dies ends with an `error` event.

When a replica's process dies, the proxy loses the websocket's other end and would just drop the client's
connection. This middleware notices a call that the app accepted but never closed, and that the client
did not leave, and tells the client why before closing it (1011). Ray loads it in every proxy from the
environment variable `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=voicepipe.cluster.proxy_hook.middlewares`,
which must be set where the Ray node starts (`voicepipe serve --replicas` sets it for the Ray it starts).
"""

import contextlib
import json

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from voicepipe.protocol import server_events

IMPORT_PATH = "voicepipe.cluster.proxy_hook.middlewares"
LOST_CODE = 1011
LOST_MESSAGE = "the replica serving this call stopped; start a new call"


class LostCalls:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        seen: set[str] = set()

        async def watched_receive() -> Message:
            message = await receive()
            seen.add(message["type"])
            return message

        async def watched_send(message: Message) -> None:
            seen.add(message["type"])
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if "websocket.accept" in seen and not seen & {"websocket.close", "websocket.disconnect"}:
                event = server_events.error("replica_lost", LOST_MESSAGE, "server_error")
                with contextlib.suppress(Exception):  # the client may be gone as well
                    await send({"type": "websocket.send", "text": json.dumps(event)})
                    await send({"type": "websocket.close", "code": LOST_CODE, "reason": "replica lost"})


def middlewares() -> list[Middleware]:
    """What Ray's proxy calls to get its middlewares."""
    return [Middleware(LostCalls)]
