"""The routes: the web page, health and metrics, the two call protocols and the text API, behind one
security check."""

import mimetypes
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from scheduler.channel.client import EngineUnavailable
from voicepipe import __version__
from voicepipe.call.native_serializer import NativeSerializer
from voicepipe.call.transport import SerializedLine
from voicepipe.server.body_limit import BodyLimit
from voicepipe.server.calls_api import build_calls_router
from voicepipe.server.chat_api import build_router, install_error_handlers
from voicepipe.server.host import CallHost
from voicepipe.server.media_streams import (
    MediaStreamLine,
    MediaStreamSerializer,
    TelnyxSerializer,
    TwilioSerializer,
    twiml,
)
from voicepipe.server.methods import Methods
from voicepipe.server.realtime import RealtimeSerializer
from voicepipe.server.security import Access

mimetypes.add_type("text/javascript", ".js")  # some systems' tables still say application/javascript
OPEN_PATHS = ("/health", "/ready", "/metrics")  # probes and scrapers: no key, nothing private
TWILIO_MEDIA = "/v1/twilio/media"  # the providers' websockets bring no key: their `start` does (media_streams.py)
TELNYX_MEDIA = "/v1/telnyx/media"


def build_app(server: CallHost) -> FastAPI:
    app = FastAPI(title="voicepipe", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    runtime = server.runtime

    @app.get("/health")
    async def health() -> dict:
        """The server process answers; whether the engine does too is /ready's question."""
        return {"status": "ok", "engine": "up" if runtime.engine.alive else "down",
                "engine_pid": getattr(runtime.engine, "pid", None)}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if server.ready:
            return JSONResponse({"status": "ready"})
        state = "draining" if server.draining else "engine_restarting"
        return JSONResponse({"status": state}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            text = await runtime.metrics_text()
        except EngineUnavailable:  # the server's own families still tell what happened to the calls
            text = generate_latest(runtime.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.websocket("/ws")
    async def native_call(ws: WebSocket) -> None:
        limits = server.limits
        await server.serve_call(ws, ws.scope["voicepipe.access"], "native",
                                lambda line: SerializedLine(line, NativeSerializer(limits.max_message_bytes)))

    @app.websocket("/v1/realtime")
    async def realtime_call(ws: WebSocket) -> None:
        beta = ws.headers.get("openai-beta", "").startswith("realtime=v1")
        limits = server.limits
        await server.serve_call(ws, ws.scope["voicepipe.access"], "realtime",
                                lambda line: SerializedLine(line, RealtimeSerializer(
                                    server.runtime, limits.max_message_bytes, beta, limits.max_conversation_items)))

    @app.api_route("/v1/twilio/voice", methods=["GET", "POST"])
    async def twilio_voice(request: Request) -> Response:
        """The TwiML a Twilio number's voice webhook fetches: connect the call to the media stream here."""
        return Response(twiml(stream_url(request, TWILIO_MEDIA), server.security.api_key), media_type="text/xml")

    @app.api_route("/v1/telnyx/voice", methods=["GET", "POST"])
    async def telnyx_voice(request: Request) -> Response:
        """The TeXML a Telnyx number's voice webhook fetches: connect the call to the media stream here."""
        return Response(twiml(stream_url(request, TELNYX_MEDIA), server.security.api_key), media_type="text/xml")

    def phone_calls(provider: str, serializer: type[MediaStreamSerializer]) -> Callable[[WebSocket], Awaitable[None]]:
        async def phone_call(ws: WebSocket) -> None:
            limits = server.limits
            await server.serve_call(ws, ws.scope["voicepipe.access"], provider,
                                    lambda line: MediaStreamLine(line, serializer(
                                        server.runtime, limits.max_message_bytes, server.security.api_key)))
        return phone_call

    app.websocket(TWILIO_MEDIA)(phone_calls("twilio", TwilioSerializer))
    app.websocket(TELNYX_MEDIA)(phone_calls("telnyx", TelnyxSerializer))

    app.include_router(build_calls_router(server.phone_calls))
    install_error_handlers(app)
    router = build_router(server.runtime, server.limits, server.metrics)
    app.include_router(router)
    app.mount("/", WebFiles(directory=server.web_dir, html=True), name="web")
    return Guard(BodyLimit(Methods(app, [*app.routes, *router.routes]), server.limits.max_body_bytes), server)


class WebFiles(StaticFiles):
    """The client's files; not the Python that makes `web/` a package."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if path.endswith((".py", ".pyc")) or "__pycache__" in path:
            raise HTTPException(404)
        return await super().get_response(path, scope)


class Guard:
    """Checks every request and websocket upgrade before the app sees it (see `Security`)."""

    def __init__(self, app: ASGIApp, server: CallHost) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        websocket = scope["type"] == "websocket"
        access = self.server.security.check(headers, scope.get("query_string", b"").decode("latin-1"), websocket)
        if not access.allowed and not _open(scope, access):
            await _refuse(scope, receive, send, access)
            return
        scope["voicepipe.access"] = access
        await self.app(scope, receive, send)


def stream_url(request: Request, path: str) -> str:
    """The websocket URL of a media stream on this server, as the provider reaching `request` sees it."""
    scheme = "wss" if request.headers.get("x-forwarded-proto", request.url.scheme) in ("https", "wss") else "ws"
    return f"{scheme}://{request.headers.get('host', '')}{path}"


def _open(scope: Scope, access: Access) -> bool:
    """The page, probes and metrics need no key (the page's calls do); a bad Host is refused everywhere."""
    if access.status != 401:
        return False
    path = scope["path"]
    if scope["type"] != "http":
        return path in (TWILIO_MEDIA, TELNYX_MEDIA)
    return path in OPEN_PATHS or not path.startswith("/v1/")


async def _refuse(scope: Scope, receive: Receive, send: Send, access: Access) -> None:
    body = {"error": {"message": access.reason, "type": "invalid_request_error",
                      "code": "invalid_api_key" if access.status == 401 else "forbidden"}}
    response = JSONResponse(body, status_code=access.status)
    if scope["type"] == "websocket":
        ws = WebSocket(scope, receive, send)
        await ws.send_denial_response(response)
    else:
        await response(scope, receive, send)
