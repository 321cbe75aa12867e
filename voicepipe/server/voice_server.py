"""The voice server: one ASGI app on uvicorn, in the caller's event loop, holding the calls."""

import asyncio
import logging
import socket
from dataclasses import replace
from pathlib import Path

import uvicorn
from starlette.websockets import WebSocket

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.call.transport import Transport
from voicepipe.mcp_servers import ServerSpec
from voicepipe.mcp_servers.phone_keys import LABEL as KEYPAD
from voicepipe.mcp_servers.phone_keys import keypad_server
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.events import Error
from voicepipe.server.app import build_app
from voicepipe.server.call_control import PhoneCalls
from voicepipe.server.heap import freeze_heap, thaw_heap
from voicepipe.server.host import Wire
from voicepipe.server.http_protocol import DeadlineH11Protocol
from voicepipe.server.listen import bind_socket, is_loopback
from voicepipe.server.loop_lag import LoopLag
from voicepipe.server.metrics import call_metrics
from voicepipe.server.security import Access, Security
from voicepipe.server.sip_calls import SipCalls
from voicepipe.server.websocket import WebSocketLine
from voicepipe.sip.agent import SipSettings
from voicepipe.turns.endpointer import SileroVAD
from voicepipe.web_files import WEB_DIR

log = logging.getLogger(__name__)
# Messages up to this many times the limit still arrive, so the session can answer them with an error
# event and go on; past it the websocket layer closes the connection (code 1009).
TRANSPORT_SLACK = 4


class ClientFaults(logging.Filter):
    """uvicorn logs a client's invalid UTF-8 text frame as an error with a traceback; the connection is
    closed with 1007 as it should be, and the fault is the client's: a warning, not a server error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("Invalid UTF-8"):
            record.levelno, record.levelname, record.exc_info, record.exc_text = logging.WARNING, "WARNING", None, None
        return True


logging.getLogger("uvicorn.error").addFilter(ClientFaults())


class VoiceServer:
    """Serves the web page, `/metrics`, `/health`, `/ready`, the OpenAI-compatible APIs, and one call
    per websocket on `/ws` (native protocol) or `/v1/realtime`, up to `limits.max_calls` at once.

    Each call starts from a copy of `call_config` (instructions, time-to-first-audio deadline, ...).
    """

    def __init__(self, runtime: Runtime, limits: Limits | None = None, call_config: CallConfig | None = None,
                 security: Security | None = None, web_dir: Path = WEB_DIR, sip: SipSettings | None = None,
                 phone_calls: PhoneCalls | None = None) -> None:
        self.runtime = runtime
        self.limits = limits or Limits()
        self.call_config = call_config or CallConfig()
        self.security = security or Security()
        self.web_dir = web_dir.resolve()
        self.calls: set[Session] = set()
        self.draining = False
        self.metrics = call_metrics(runtime.registry)
        self.loop_lag = LoopLag(self.metrics.loop_lag)
        self._notices: set[asyncio.Future] = set()
        runtime.engine.watch(self._engine_changed)
        self.phone_calls = phone_calls or PhoneCalls()  # who answers them: the operator's webhook, or the server
        self.sip = SipCalls(self, sip, self.phone_calls) if sip is not None else None  # phone calls, where SIP is on
        self.app = build_app(self)
        self.uvicorn: uvicorn.Server | None = None
        self.sockets: list[socket.socket] = []

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 8000, sock: socket.socket | None = None,
                    ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> None:
        """Listen on `sock`, or on host:port. A server bound to loopback only answers loopback names."""
        sock = sock or bind_socket(host, port)
        if not is_loopback(sock.getsockname()[0]) and self.security.loopback_only:
            self.security = replace(self.security, loopback_only=False)  # reachable under any name
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", http=DeadlineH11Protocol, ws="websockets-sansio",
            # No permessage-deflate: PCM barely compresses, and deflating it costs the cores the models need.
            ws_per_message_deflate=False, ws_max_size=TRANSPORT_SLACK * self.limits.max_message_bytes,
            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, timeout_graceful_shutdown=5)
        config.load()
        self.uvicorn = uvicorn.Server(config)
        # What uvicorn's own serve() does, less its signal handlers and tick loop: the caller owns both.
        self.uvicorn.lifespan = config.lifespan_class(config)
        self.sockets = [sock]
        await self.uvicorn.startup(sockets=[sock])
        if self.sip is not None:
            await self.sip.listen()
        SileroVAD()  # the calls' shared VAD session loads now (0.15-0.4 s here), not on the first call's loop
        freeze_heap()
        self.loop_lag.start()

    @property
    def port(self) -> int:
        return self.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host, port = self.sockets[0].getsockname()[:2]
        scheme = "https" if self.uvicorn is not None and self.uvicorn.config.is_ssl else "http"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    @property
    def ready(self) -> bool:
        return self.runtime.ready and not self.draining

    async def close(self) -> None:
        """Close every call, then stop listening."""
        self.loop_lag.stop()
        if self.sip is not None:
            await self.sip.close()
        await asyncio.gather(*(call.transport.close(1001, "server shutting down") for call in list(self.calls)),
                             return_exceptions=True)
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
            await self.uvicorn.shutdown()
            self.uvicorn = None
            thaw_heap()

    async def drain(self, grace_s: float) -> None:
        """Refuse new calls; give replies in progress up to `grace_s` to finish."""
        self.draining = True
        end = asyncio.get_running_loop().time() + grace_s
        while any(call.replying for call in self.calls) and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(0.1)

    # -- calls -----------------------------------------------------------------------------------------------
    async def serve_call(self, ws: WebSocket, access: Access, api: str, wire: Wire) -> None:
        """Accept one call, or tell the client why not; runs until the call ends."""
        protocols = ws.scope.get("subprotocols", [])
        await ws.accept(subprotocol="realtime" if "realtime" in protocols else None)
        line = WebSocketLine(ws)
        transport = wire(line)
        refusal = self.refusal()
        if refusal is not None:
            code, reason, message = refusal
            self.metrics.refused.labels(reason).inc()
            log.info("refused a call: %s", message)
            await transport.send(Error(reason, message, "server_error"))
            await line.close(code, reason.replace("_", " "))
            return
        try:
            await self.host(transport, api, access.may_tune)
        finally:
            await line.close()

    async def host(self, transport: Transport, api: str, may_tune: bool) -> None:
        """Run one admitted call's session over `transport` until it ends."""
        policy = self.runtime.mcp
        keypad = getattr(transport, "keypad", None)  # a phone line whose keys a tool may press
        press = keypad() if keypad is not None else None
        if press is not None:
            policy = replace(policy, servers={**policy.servers, KEYPAD: ServerSpec(KEYPAD, local=keypad_server(press))})
        session = Session(transport, self.runtime, self.limits, self.call_config, may_tune=may_tune, mcp=policy)
        self.calls.add(session)
        self.metrics.active.labels(api).inc()
        try:
            await session.run()
        finally:
            self.calls.discard(session)
            self.metrics.active.labels(api).dec()

    def _engine_changed(self, alive: bool) -> None:
        """The engine process died (or is back): every call hears it at once. A turn in flight, or one the
        caller starts meanwhile, waits for the engine and is answered once it is back (the client holds the
        realtime work and sends it again); if it is not back within the client's `redo_within_s`, the
        caller hears that the turn failed."""
        if alive:
            log.info("the engine is back; %d calls go on", len(self.calls))
            return
        self.metrics.engine_failures.inc()
        for call in list(self.calls):
            notice = asyncio.ensure_future(call.send(Error(
                "engine_unavailable", "the engine stopped and is restarting; what you said is kept and will "
                "be answered once it is back (usually within seconds)", "server_error")))
            self._notices.add(notice)
            notice.add_done_callback(self._notices.discard)

    def refusal(self, pending: int = 0) -> tuple[int, str, str] | None:
        """Why a new call cannot be taken now (a websocket close code, a reason, a message), or None;
        `pending` calls are answered but not yet counted."""
        if self.draining:
            return 1012, "server_shutting_down", "the server is shutting down; try again later"
        if not self.runtime.engine.alive:
            return 1013, "engine_unavailable", "the engine is restarting; try again in a few seconds"
        if len(self.calls) + pending >= self.limits.max_calls:
            limit = self.limits.max_calls
            return 1013, "too_many_calls", f"the server takes at most {limit} calls at once; try again later"
        return None
