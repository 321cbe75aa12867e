"""Telephony media streams: a phone call's audio over a websocket, as Twilio (`<Connect><Stream>`) and Telnyx
(Media Streaming, bidirectional) send it. One serializer reads both; each provider's wire format is a small
subclass that reads its `start` and addresses what goes out.

The provider's JSON messages in (`connected`, `start`, `media` with base64 G.711 at 8 kHz, `mark`, `dtmf`,
`stop`) read as 16 kHz PCM16 frames and keys pressed; out, the reply's audio becomes `media` (in the call's
G.711), its end a `mark` (sent back once the caller has heard it all), and a barge-in `clear` (the provider
drops the audio it has queued). Everything else the session says has no place on a phone line and is
dropped. A provider cannot read an error, so a malformed message is logged and skipped.

Neither provider's websocket brings the API key when it connects, so where the server has one, the call
starts only when `start` brings it among its custom parameters (the TwiML this server writes passes it).
"""

import asyncio
import base64
import binascii
import hmac
import json
import logging
from typing import Any
from xml.sax.saxutils import quoteattr

from voicepipe.call.runtime import Runtime
from voicepipe.call.transport import SerializedLine
from voicepipe.pipeline.events import Error, Event
from voicepipe.pipeline.outbound import AudioEnded, AudioSent, PlaybackCleared
from voicepipe.protocol import ClientEvent
from voicepipe.protocol.transport import Disconnected, Line, Refused
from voicepipe.server.metrics import call_metrics
from voicepipe.server.phone_audio import PhoneAudio
from voicepipe.server.phone_leg import PhoneLeg
from voicepipe.wire_audio import PCMA, PCMU, WireAudio

log = logging.getLogger(__name__)
START_WITHIN_S = 10.0  # a stream that has not started by then is no phone call: it holds a call's place


def twiml(stream_url: str, api_key: str | None) -> str:
    """The TwiML (Twilio's, and Telnyx's TeXML) that connects a call to this server's media stream."""
    key = f'<Parameter name="api_key" value={quoteattr(api_key)}/>' if api_key else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url={quoteattr(stream_url)}>'
            f"{key}</Stream></Connect></Response>")


class MediaStreamSerializer:
    """A provider's media stream: its messages in, the reply's audio and the barge-ins out."""

    provider = ""

    def __init__(self, runtime: Runtime, max_message_bytes: int, api_key: str | None) -> None:
        self.max_message_bytes, self.api_key = max_message_bytes, api_key
        self.tts_rate = runtime.tts_rate
        self.stream_sid: str | None = None  # known from `start`; nothing is sent before it
        self.call_sid: str | None = None
        self.audio = PhoneAudio(PCMU, self.tts_rate)  # in the call's G.711, once `start` names it
        self.leg = PhoneLeg()
        self._metrics = call_metrics(runtime.registry)
        self._recorded = False

    def started(self, event: dict) -> tuple[str, str | None, dict, WireAudio | None]:
        """From a `start` event: the stream's id, the call's, its custom parameters, and its codec (None:
        one this server does not speak)."""
        raise NotImplementedError

    def envelope(self, event: dict[str, Any]) -> dict[str, Any]:
        """An outgoing message as the provider wants it addressed."""
        return event

    # -- provider -> session ---------------------------------------------------------------------------------
    def parse(self, message: str | bytes) -> bytes | dict | None:
        if isinstance(message, bytes) or len(message) > self.max_message_bytes:
            log.warning("%s stream %s: skipped a %s message", self.provider, self.stream_sid,
                        "binary" if isinstance(message, bytes) else "too large")
            return None
        try:
            return self._inbound(json.loads(message)) or None
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, RecursionError) as e:
            log.warning("%s stream %s: skipped a malformed message (%s: %s)", self.provider, self.stream_sid,
                        type(e).__name__, e)
            return None

    def _inbound(self, event: dict) -> bytes | dict | None:
        kind = event["event"]
        if kind == "start":
            self._start(event)
        elif kind == "media" and self.stream_sid is not None and event["media"].get("track", "inbound") == "inbound":
            coded = base64.b64decode(event["media"]["payload"], validate=True)
            media = event["media"]
            gap = 0 if "chunk" not in media else self.leg.packet(
                int(media["chunk"]), int(media.get("timestamp", 0)), asyncio.get_running_loop().time())
            if gap is None:
                return None  # too late to play in order
            return self.audio.heard(coded, gap)  # a gap lost on the way: its silence keeps the caller's clock
        elif kind == "stop":
            self.ended()
            raise Disconnected()
        elif kind == "dtmf" and self.stream_sid is not None:
            return {"type": ClientEvent.KEY_PRESSED, "digit": str(event["dtmf"]["digit"])}
        return None  # connected, mark (the caller has heard a reply to its end), media before start, error

    def _start(self, event: dict) -> None:
        stream, call, parameters, codec = self.started(event)
        given = parameters.get("api_key", "")
        if self.api_key is not None and not hmac.compare_digest(str(given).encode(), self.api_key.encode()):
            log.warning("%s call %s refused: its stream brought no valid API key", self.provider, call)
            raise Refused(1008, "a valid API key is required")
        if codec is None:
            log.warning("%s call %s refused: media format %s", self.provider, call, event["start"])
            raise Refused(1003, "only G.711 (PCMU or PCMA) at 8000 Hz is spoken here")
        self.stream_sid, self.call_sid = stream, call
        self.audio = PhoneAudio(codec, self.tts_rate)
        log.info("%s call %s: stream %s started (%s)", self.provider, call, stream, codec.coding)

    # -- session -> provider ---------------------------------------------------------------------------------
    def render(self, event: Event) -> list[dict | bytes]:
        if self.stream_sid is None:
            return []
        if isinstance(event, AudioSent):
            return self._media(self.audio.spoken(event.pcm.tobytes()))
        if isinstance(event, AudioEnded):
            return [*self._media(self.audio.spoken(b"", last=True)),
                    self.envelope({"event": "mark", "mark": {"name": event.turn.response_id}})]
        if isinstance(event, PlaybackCleared):
            self.audio.cut()
            return [self.envelope({"event": "clear"})]
        if isinstance(event, Error):
            log.warning("%s call %s: %s", self.provider, self.call_sid, event.message)
        return []

    def _media(self, coded: bytes) -> list[dict | bytes]:
        return [self.envelope({"event": "media", "media": {"payload": base64.b64encode(coded).decode()}})] if coded \
            else []

    def ended(self) -> None:
        """The call is over: its leg's packet figures are recorded, once."""
        if self._recorded or self.stream_sid is None:
            return
        self._recorded = True
        self.leg.record(self.provider, self._metrics.phone_packets, self._metrics.phone_jitter)
        log.info("%s call %s ended: %s", self.provider, self.call_sid, self.leg.figures())


class MediaStreamLine(SerializedLine):
    """A media stream's websocket as a session's transport: it must `start` within START_WITHIN_S, and its
    leg's figures are recorded however it ends."""

    serializer: MediaStreamSerializer

    def __init__(self, line: Line, serializer: MediaStreamSerializer) -> None:
        super().__init__(line, serializer)
        self._start_by: float | None = None  # the loop's time by which `start` must have come

    async def next_message(self) -> str | bytes:
        if self._start_by is None:
            self._start_by = asyncio.get_running_loop().time() + START_WITHIN_S
        try:
            async with asyncio.timeout_at(None if self.serializer.stream_sid is not None else self._start_by):
                return await self.line.recv()
        except Disconnected:
            self.serializer.ended()  # the provider hung up without a `stop`
            raise
        except TimeoutError:
            provider = self.serializer.provider
            log.warning("%s stream refused: no start message within %g s", provider, START_WITHIN_S)
            await self.line.close(1008, "no start message")
            raise Disconnected() from None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.serializer.ended()
        await self.line.close(code, reason)


class TwilioSerializer(MediaStreamSerializer):
    """Twilio Media Streams: μ-law only; the stream's id in `start.streamSid`, and on every message sent."""

    provider = "twilio"

    def started(self, event: dict) -> tuple[str, str | None, dict, WireAudio | None]:
        start = event["start"]
        media = start.get("mediaFormat") or {}
        mulaw = media.get("encoding", "audio/x-mulaw") == "audio/x-mulaw" and int(media.get("sampleRate", 8000)) == 8000
        return str(start["streamSid"]), start.get("callSid"), start.get("customParameters") or {}, \
            PCMU if mulaw else None

    def envelope(self, event: dict[str, Any]) -> dict[str, Any]:
        return {**event, "streamSid": self.stream_sid}


class TelnyxSerializer(MediaStreamSerializer):
    """Telnyx Media Streaming in RTP mode: the call's own G.711 (PCMU or PCMA, as `start.media_format` says),
    the stream's id at the top of `start`; what is sent back needs no address."""

    provider = "telnyx"

    def started(self, event: dict) -> tuple[str, str | None, dict, WireAudio | None]:
        start = event["start"]
        media = start.get("media_format") or {}
        codec = {"PCMU": PCMU, "PCMA": PCMA}.get(str(media.get("encoding", "PCMU")).upper())
        return str(event["stream_id"]), start.get("call_control_id"), start.get("custom_parameters") or {}, \
            codec if int(media.get("sample_rate", 8000)) == 8000 else None
