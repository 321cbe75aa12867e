"""A SIP call as the session's transport: the caller's RTP in order (lost packets as silence, late ones
dropped, keys pressed as events), the reply coded and queued onto the call's RTP clock, dropped from the
queue the moment the caller barges in, and the call hung up with a BYE when the session ends it.

The line is in this process, so it reads the session's events as they are (no wire format between); as on
the media-stream websockets, what the session says beyond audio has no place on a phone line and is dropped
(errors are logged)."""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from voicepipe.call.runtime import Runtime
from voicepipe.pipeline.events import Error, Event
from voicepipe.pipeline.outbound import AudioEnded, AudioSent, PlaybackCleared
from voicepipe.protocol import ClientEvent
from voicepipe.protocol.transport import Disconnected
from voicepipe.server.metrics import call_metrics
from voicepipe.server.phone_audio import PhoneAudio
from voicepipe.server.phone_leg import PhoneLeg
from voicepipe.server.realtime_session import native_update
from voicepipe.sip.dialog import SipCall

log = logging.getLogger(__name__)


class SipLine:
    provider = "sip"

    def __init__(self, call: SipCall, runtime: Runtime, session: dict[str, Any] | None = None) -> None:
        self.call = call
        # the settings the call was accepted with (Realtime's shape), the session's first update
        self._update = {"type": ClientEvent.SESSION_UPDATE, "session": native_update(session)} if session else None
        self.audio = PhoneAudio(call.offer.codec, runtime.tts_rate)
        self.leg = PhoneLeg()
        self._metrics = call_metrics(runtime.registry)
        self._recorded = False

    async def recv(self) -> bytes | dict:
        if self._update is not None:
            update, self._update = self._update, None
            return update
        while True:
            item = await self.call.inbox.get()
            if item[0] == "ended":
                self._ended()
                raise Disconnected()
            if item[0] == "digit":
                return {"type": ClientEvent.KEY_PRESSED, "digit": item[1]}
            _, sequence, timestamp, payload = item
            gap = self.leg.packet(sequence, timestamp // 8, asyncio.get_running_loop().time())
            if gap is not None:  # None: too late to be heard in order
                return self.audio.heard(payload, gap)

    async def send(self, event: Event) -> None:
        rtp = self.call.rtp
        if self.call.ended is not None or rtp is None:
            raise Disconnected()
        if isinstance(event, AudioSent):
            rtp.play(self.audio.spoken(event.pcm.tobytes()))
        elif isinstance(event, AudioEnded):
            rtp.play(self.audio.spoken(b"", last=True))
        elif isinstance(event, PlaybackCleared):
            self.audio.cut()
            rtp.clear()
        elif isinstance(event, Error):
            log.warning("SIP call %s: %s", self.call.call_id, event.message)

    def keypad(self) -> Callable[[str], None] | None:
        """What presses keys on the line for a tool, as RFC 4733 events (None: the caller's side takes none)."""
        rtp = self.call.rtp
        return rtp.send_digits if rtp is not None and rtp.event_type is not None else None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self._ended()
        await self.call.hang_up(reason or "hung up by the server")

    def _ended(self) -> None:
        if self._recorded:
            return
        self._recorded = True
        self.leg.record(self.provider, self._metrics.phone_packets, self._metrics.phone_jitter)
        log.info("SIP call %s: %s", self.call.call_id, self.leg.figures())
