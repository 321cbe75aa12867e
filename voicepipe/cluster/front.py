"""What a replica adds in front of the single-process app: its name on every response (a header, so a
client or a test can tell which replica served it), and the fleet's view on `/ready` and `/metrics`."""

from collections.abc import Awaitable, Callable

from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REPLICA_HEADER = b"x-voicepipe-replica"


class ReplicaFront:
    """Wraps the app: tags responses and websocket handshakes with `replica`, answers the two fleet paths.

    `ready()` says whether every replica is ready (with a few words on why not); `metrics()` renders the
    fleet's page. The page, the APIs and the calls are the app's own.
    """

    def __init__(self, app: ASGIApp, replica: str, ready: Callable[[], Awaitable[tuple[bool, dict]]],
                 metrics: Callable[[], Awaitable[bytes]]) -> None:
        self.app, self.replica, self.ready, self.metrics = app, replica, ready, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, self.replica.encode())]}
            await send(message)

        if scope["type"] == "http" and scope["path"] == "/ready":
            ready, detail = await self.ready()
            await JSONResponse(detail, status_code=200 if ready else 503)(scope, receive, tagged)
        elif scope["type"] == "http" and scope["path"] == "/metrics":
            await Response(await self.metrics(), media_type=CONTENT_TYPE_LATEST)(scope, receive, tagged)
        else:
            await self.app(scope, receive, tagged)
