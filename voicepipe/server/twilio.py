"""Twilio Media Streams: a phone call's audio over a websocket, as Twilio's `<Connect><Stream>` sends it.

A `TwilioDialect` is the transport the session talks to, as `RealtimeDialect` is for the Realtime API: Twilio's
JSON messages in (`connected`, `start`, `media` with base64 μ-law at 8 kHz, `mark`, `dtmf`, `stop`) become
16 kHz PCM16 frames; the session's events out become `media` (the reply, μ-law at 8 kHz), a `mark` at the end
of each reply's audio (Twilio sends it back once the caller has heard it all), and `clear` the moment the
caller barges in (Twilio drops the audio it has queued). Everything else the session says has no place on a
phone line and is dropped. Twilio cannot read an error, so a malformed message is logged and skipped.

Twilio's websocket carries no API key (its Stream URL takes no query string), so where the server has one
the TwiML this server writes passes it as a `<Parameter>`, and the call starts only when `start` brings it.
"""

import asyncio
import base64
import binascii
import hmac
import json
import logging
from typing import Any
from xml.sax.saxutils import quoteattr

import numpy as np
import soxr

from voicepipe.call.runtime import Runtime
from voicepipe.protocol import ClientEvent, ServerEvent
from voicepipe.protocol.transport import Disconnected, Transport
from voicepipe.turns.endpointer import SAMPLE_RATE
from voicepipe.wire_audio import PCMU

log = logging.getLogger(__name__)
ENCODING = "audio/x-mulaw"  # the only media format Twilio streams
START_WITHIN_S = 10.0  # a stream that has not started by then is no Twilio call: it holds a call's place


def twiml(stream_url: str, api_key: str | None) -> str:
    """The TwiML that connects a call to this server's media stream."""
    key = f'<Parameter name="api_key" value={quoteattr(api_key)}/>' if api_key else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url={quoteattr(stream_url)}>'
            f"{key}</Stream></Connect></Response>")


class TwilioDialect:
    """A Transport speaking Twilio Media Streams to `line` and the native protocol to the session."""

    def __init__(self, line: Transport, runtime: Runtime, max_message_bytes: int, api_key: str | None) -> None:
        self.line, self.max_message_bytes, self.api_key = line, max_message_bytes, api_key
        self.tts_rate = runtime.tts_rate
        self.stream_sid: str | None = None  # known from `start`; nothing is sent before it
        self.call_sid: str | None = None
        self._mic = soxr.ResampleStream(PCMU.rate, SAMPLE_RATE, 1, dtype="int16")
        self._speaker: soxr.ResampleStream | None = None
        self._start_by: float | None = None  # the loop's time by which `start` must have come

    # -- Twilio -> session -----------------------------------------------------------------------------------
    async def recv(self) -> bytes | dict:
        while True:
            if self._start_by is None:
                self._start_by = asyncio.get_running_loop().time() + START_WITHIN_S
            try:
                async with asyncio.timeout_at(None if self.stream_sid is not None else self._start_by):
                    message = await self.line.recv()
            except TimeoutError:
                log.warning("twilio stream refused: no start message within %g s", START_WITHIN_S)
                await self.line.close(1008, "no start message")
                raise Disconnected() from None
            if isinstance(message, bytes) or len(message) > self.max_message_bytes:
                log.warning("twilio stream %s: skipped a %s message", self.stream_sid,
                            "binary" if isinstance(message, bytes) else "too large")
                continue
            try:
                event = json.loads(message)
                audio = await self._inbound(event)
            except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, RecursionError) as e:
                log.warning("twilio stream %s: skipped a malformed message (%s: %s)", self.stream_sid,
                            type(e).__name__, e)
                continue
            if audio:
                return audio  # or a key the caller pressed

    async def _inbound(self, event: dict) -> bytes | dict | None:
        kind = event["event"]
        if kind == "start":
            await self._start(event["start"])
        elif kind == "media" and self.stream_sid is not None and event["media"].get("track", "inbound") == "inbound":
            samples = PCMU.decode(base64.b64decode(event["media"]["payload"], validate=True))
            return self._mic.resample_chunk(samples).astype("<i2").tobytes()
        elif kind == "stop":
            raise Disconnected()
        elif kind == "dtmf" and self.stream_sid is not None:
            return {"type": ClientEvent.KEY_PRESSED, "digit": str(event["dtmf"]["digit"])}
        return None  # connected, mark (the caller has heard a reply to its end), media before start

    async def _start(self, start: dict) -> None:
        given = (start.get("customParameters") or {}).get("api_key", "")
        if self.api_key is not None and not hmac.compare_digest(str(given).encode(), self.api_key.encode()):
            log.warning("twilio call %s refused: its stream brought no valid API key", start.get("callSid"))
            await self.line.close(1008, "a valid API key is required")
            raise Disconnected()
        media = start.get("mediaFormat") or {}
        if media.get("encoding", ENCODING) != ENCODING or int(media.get("sampleRate", PCMU.rate)) != PCMU.rate:
            log.warning("twilio call %s refused: media format %s", start.get("callSid"), media)
            await self.line.close(1003, "only audio/x-mulaw at 8000 Hz is spoken here")
            raise Disconnected()
        self.stream_sid, self.call_sid = str(start["streamSid"]), start.get("callSid")
        log.info("twilio call %s: stream %s started", self.call_sid, self.stream_sid)

    # -- session -> Twilio -----------------------------------------------------------------------------------
    async def send(self, message: dict | bytes) -> None:
        if self.stream_sid is None:
            return
        if isinstance(message, bytes):
            await self._media(np.frombuffer(message, "<i2"))
            return
        kind = message.get("type")  # a reply's audio.delta needs nothing: its binary frame follows
        if kind == ServerEvent.RESPONSE_AUDIO_DONE:
            if self._speaker is not None:
                await self._media(np.zeros(0, np.int16), last=True)
            await self._send({"event": "mark", "mark": {"name": message["response_id"]}})
        elif kind == ServerEvent.PLAYBACK_CLEARED:
            self._speaker = None
            await self._send({"event": "clear"})
        elif kind == ServerEvent.ERROR:
            log.warning("twilio call %s: %s", self.call_sid, message["error"]["message"])

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.line.close(code, reason)

    async def _media(self, samples: np.ndarray, last: bool = False) -> None:
        if self._speaker is None:
            self._speaker = soxr.ResampleStream(self.tts_rate, PCMU.rate, 1, dtype="int16")
        audio = self._speaker.resample_chunk(samples, last=last).astype(np.int16)
        if last:
            self._speaker = None
        if len(audio):
            await self._send({"event": "media", "media": {"payload": base64.b64encode(PCMU.encode(audio)).decode()}})

    async def _send(self, event: dict[str, Any]) -> None:
        await self.line.send({**event, "streamSid": self.stream_sid})
