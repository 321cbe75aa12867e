"""The server: one websockets server on one port serves the web page, the metrics, and the calls on /ws."""

import asyncio
import email.utils
import http
import json
import logging
from pathlib import Path
from urllib.parse import unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from voicepipe.limits import Limits
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.output import error_message
from voicepipe.runtime import Runtime
from voicepipe.session import Session

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parent.parent / "web"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".json": "application/json",
    ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon", ".wav": "audio/wav",
    ".txt": "text/plain; charset=utf-8",
}
# Messages up to this many times the limit still arrive, so the session can answer them with an error
# event and go on; past it the websocket layer closes the connection (code 1009).
TRANSPORT_SLACK = 4


class VoiceServer:
    """Serves `web/`, `/metrics` and one call per websocket on `/ws`, up to `limits.max_calls` at once.

    Each call starts from a copy of `call_config` (instructions, time-to-first-audio deadline, ...).
    """

    def __init__(self, runtime: Runtime, limits: Limits | None = None, web_dir: Path = WEB_DIR,
                 call_config: CallConfig | None = None) -> None:
        self.runtime = runtime
        self.limits = limits or Limits()
        self.call_config = call_config or CallConfig()
        self.web_dir = web_dir.resolve()
        self.calls: set[Session] = set()
        self.server: Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        # No permessage-deflate: PCM barely compresses, and deflating it costs the cores the models need.
        self.server = await serve(self._call, host, port, process_request=self._http, compression=None,
                                  max_size=TRANSPORT_SLACK * self.limits.max_message_bytes)

    @property
    def port(self) -> int:
        assert self.server is not None, "not started"
        return self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        assert self.server is not None, "not started"
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    # -- calls -----------------------------------------------------------------------------------------------
    async def _call(self, ws: ServerConnection) -> None:
        if len(self.calls) >= self.limits.max_calls:
            limit = self.limits.max_calls
            log.info("refused a call: %d calls already", limit)
            message = f"the server takes at most {limit} calls at once; try again later"
            await ws.send(json.dumps(error_message("too_many_calls", message, "server_error")))
            await ws.close(1013, "too many calls")
            return
        session = Session(ws, self.runtime, self.limits, self.call_config)
        self.calls.add(session)
        try:
            await session.run()
        finally:
            self.calls.discard(session)

    # -- plain HTTP ------------------------------------------------------------------------------------------
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/ws":
            return None  # the websocket handshake goes on
        if path == "/metrics":
            self.runtime.engine.snapshot()  # refreshes the queue and pool gauges
            return _response(http.HTTPStatus.OK, generate_latest(self.runtime.engine.metrics.registry),
                             CONTENT_TYPE_LATEST)
        file = self._static_file(path)
        if file is None:
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n", CONTENT_TYPES[".txt"])
        return _response(http.HTTPStatus.OK, file.read_bytes(),
                         CONTENT_TYPES.get(file.suffix, "application/octet-stream"))

    def _static_file(self, path: str) -> Path | None:
        """The file under web/ that `path` names; None for anything outside it or not a plain file."""
        relative = unquote(path).lstrip("/") or "index.html"
        parts = relative.split("/")
        if "\\" in relative or "\0" in relative or any(p in ("", ".", "..") for p in parts):
            return None
        file = (self.web_dir / relative).resolve()
        return file if file.is_relative_to(self.web_dir) and file.is_file() else None


def _response(status: http.HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers([("Date", email.utils.formatdate(usegmt=True)), ("Content-Type", content_type),
                       ("Content-Length", str(len(body))), ("Cache-Control", "no-cache"),
                       ("X-Content-Type-Options", "nosniff"), ("Connection", "close")])
    return Response(status.value, status.phrase, headers, body)


async def run_server(runtime: Runtime, host: str, port: int, limits: Limits | None = None,
                     call_config: CallConfig | None = None) -> None:
    """Warm the models up, then serve until cancelled; prints the URL once the server listens.

    On the way out the calls are closed first, then the engine is stopped while this event loop still
    runs, so the aborts of their requests find a loop to report to.
    """
    server = VoiceServer(runtime, limits, call_config=call_config)
    try:
        await runtime.warm_up()
        await server.start(host, port)
        print(f"voicepipe: listening on {server.url}", flush=True)
        await asyncio.Future()
    finally:
        await server.close()
        runtime.close()
