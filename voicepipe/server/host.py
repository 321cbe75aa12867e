"""What the app's routes ask of the server that hosts them (`VoiceServer` is the one): the server builds
its app from itself, so the app knows it by this interface alone, and neither module imports the other's
importer."""

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from starlette.websockets import WebSocket

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.transport import Transport
from voicepipe.protocol.transport import Line
from voicepipe.server.call_control import PhoneCalls
from voicepipe.server.metrics import CallMetrics
from voicepipe.server.security import Access, Security

Wire = Callable[[Line], Transport]  # a websocket line as a call's transport, in the wire format of its route


class CallHost(Protocol):
    runtime: Runtime
    limits: Limits
    metrics: CallMetrics
    security: Security
    web_dir: Path
    draining: bool
    phone_calls: PhoneCalls

    @property
    def ready(self) -> bool:
        """Warm, the engine up, and not draining: what /ready answers."""

    async def serve_call(self, ws: WebSocket, access: Access, api: str, wire: Wire) -> None:
        """Accept one call, or tell the client why not; runs until the call ends."""

    async def host(self, transport: Transport, api: str, may_tune: bool) -> None:
        """Run one admitted call's session over `transport` until it ends."""

    def refusal(self, pending: int = 0) -> tuple[int, str, str] | None:
        """Why a new call cannot be taken now (a websocket close code, a reason, a message), or None."""
