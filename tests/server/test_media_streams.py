"""Telephony media streams over the real server and the fake engine: Twilio's (the TwiML route, a call's
μ-law audio both ways, `clear` on a barge-in and a `mark` after each reply, the API key carried in the
stream's `start`, malformed or silent streams, keys pressed) and Telnyx's (A-law both ways, its own `start`
and unaddressed replies, a codec it cannot speak refused). The client here stands in for the provider's
side of the phone network, which cannot exist in a test; it sends and reads what the providers'
documentation shows."""

import asyncio
import base64
import json
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from support.fake_call import fake_server, http_post
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from voicepipe.audio import read_audio, to_pcm16
from voicepipe.call.limits import Limits
from voicepipe.server import media_streams
from voicepipe.server.security import Security
from voicepipe.wire_audio import PCMA, PCMU

KEY = "sk-phone"
VOICE = read_audio(Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav", 8000)
REPLY = " ".join(["word"] * 40)  # four seconds of the fake voice: still playing when the caller speaks again


def media(audio: np.ndarray, first: int = 1) -> list[dict]:
    """The caller's audio as Twilio's `media` messages: 20 ms of μ-law each, numbered on from `first`."""
    coded = PCMU.encode(to_pcm16(audio))
    return [{"event": "media", "streamSid": "MZ1", "media": {"track": "inbound", "chunk": str(n), "timestamp":
                                                              str(20 * (n - 1)), "payload": base64.b64encode(
                                                                  coded[i:i + 160]).decode()}}
            for n, i in enumerate(range(0, len(coded), 160), first)]


def start(key: str | None = None) -> dict:
    params = {"api_key": key} if key else {}
    return {"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
        "streamSid": "MZ1", "callSid": "CA1", "accountSid": "AC1", "tracks": ["inbound"], "customParameters": params,
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}


class Phone:
    """The provider's end of one media stream: sends the caller's audio in real time, keeps what comes back."""

    def __init__(self, ws, media=None) -> None:
        self.ws, self.received, self.media = ws, [], media or globals()["media"]
        self.sent = 0  # packets sent: the stream numbers them on across what the caller says
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self.received.append(json.loads(message))
        except ConnectionClosed:
            pass

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.received if m["event"] == kind]

    async def say(self, audio: np.ndarray) -> None:
        t0 = time.monotonic()
        packets = self.media(audio, self.sent + 1)
        self.sent += len(packets)
        for n, message in enumerate(packets):
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
            await self.ws.send(json.dumps(message))

    async def until(self, kind: str, count: int = 1, timeout: float = 20) -> dict:
        end = time.monotonic() + timeout
        while len(self.of(kind)) < count:
            assert time.monotonic() < end and not self.reader.done(), [m["event"] for m in self.received]
            await asyncio.sleep(0.01)
        return self.of(kind)[count - 1]


async def test_twiml_connects_the_call_to_the_media_stream_and_a_keyed_server_asks_for_the_key():
    async with fake_server(Limits()) as (server, _):
        status, _, body = await http_post(server, {}, path="/v1/twilio/voice")
        assert status == 200 and '<Stream url="ws://127.0.0.1/v1/twilio/media">' in body.decode()  # the Host asked
        assert "api_key" not in body.decode()
    async with fake_server(Limits(), security=Security(KEY)) as (server, _):
        status, _, _ = await http_post(server, {}, path="/v1/twilio/voice")
        assert status == 401
        basic = base64.b64encode(f"twilio:{KEY}".encode()).decode()  # https://twilio:KEY@host/... in the console
        status, _, body = await http_post(server, {}, path="/v1/twilio/voice",
                                          headers={"Authorization": f"Basic {basic}"})
        assert status == 200 and f'<Parameter name="api_key" value="{KEY}"/>' in body.decode()


async def test_a_phone_call_is_heard_answered_in_mulaw_marked_and_cleared_on_a_barge_in():
    async with fake_server(Limits(), reply=REPLY, heard="What is the capital of France?") as (server, engine):
        async with connect(f"ws://127.0.0.1:{server.port}/v1/twilio/media") as ws:
            phone = Phone(ws)
            await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            await ws.send("{not json")  # skipped: Twilio cannot read an error
            await ws.send(json.dumps(start()))
            await phone.say(np.concatenate([VOICE, np.zeros(8000, np.float32)]))
            first = await phone.until("media")
            assert first["streamSid"] == "MZ1" and len(base64.b64decode(first["media"]["payload"])) > 0
            await phone.say(VOICE)  # over the reply
            await phone.until("clear")
            assert phone.of("clear")[0]["streamSid"] == "MZ1"
            await ws.send(json.dumps({"event": "stop", "streamSid": "MZ1", "stop": {"callSid": "CA1"}}))
            await asyncio.wait_for(phone.reader, 5)
        answered = b"".join(base64.b64decode(m["media"]["payload"]) for m in phone.of("media"))
        tone = PCMU.decode(answered)
        assert np.median(np.abs(tone.astype(np.int32))) == pytest.approx(1000, abs=100)  # the fake voice's tone
        assert len(engine.requests) >= 2  # the question, then the words said over the reply
    async with fake_server(Limits(), reply="Paris.", heard="What is the capital of France?") as (server, _):
        async with connect(f"ws://127.0.0.1:{server.port}/v1/twilio/media") as ws:
            phone = Phone(ws)
            await ws.send(json.dumps(start()))
            await phone.say(np.concatenate([VOICE, np.zeros(8000, np.float32)]))
            mark = await phone.until("mark")  # after the reply's last media: Twilio echoes it once played
            assert phone.received.index(mark) > max(phone.received.index(m) for m in phone.of("media"))


async def test_a_keyed_server_takes_the_stream_only_with_the_key_in_its_start():
    async with fake_server(Limits(), heard="Hello?", security=Security(KEY)) as (server, _):
        url = f"ws://127.0.0.1:{server.port}/v1/twilio/media"
        async with connect(url) as ws:
            await ws.send(json.dumps(start("wrong")))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd.code == 1008
        async with connect(url) as ws:
            phone = Phone(ws)
            await ws.send(json.dumps(start(KEY)))
            await phone.say(np.concatenate([VOICE, np.zeros(8000, np.float32)]))
            await phone.until("media")
        for _ in range(100):
            if not server.calls:
                break
            await asyncio.sleep(0.05)
        assert not server.calls


async def test_a_stream_that_never_starts_is_closed(monkeypatch):
    monkeypatch.setattr(media_streams, "START_WITHIN_S", 0.3)
    async with fake_server(Limits()) as (server, _):
        async with connect(f"ws://127.0.0.1:{server.port}/v1/twilio/media") as ws:
            for message in media(VOICE[:4000]):  # media before start is not a call's
                await ws.send(json.dumps(message))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd.code == 1008


async def test_keys_pressed_on_the_phone_join_the_conversation_as_one_message_once_the_caller_pauses(monkeypatch):
    from voicepipe.pipeline import keypad

    monkeypatch.setattr(keypad, "PAUSE_S", 0.3)
    async with fake_server(Limits(), reply="Sales it is.") as (server, engine):
        async with connect(f"ws://127.0.0.1:{server.port}/v1/twilio/media") as ws:
            phone = Phone(ws)
            await ws.send(json.dumps(start()))
            for n, digit in enumerate("12#"):
                await ws.send(json.dumps({"event": "dtmf", "streamSid": "MZ1", "sequenceNumber": str(n + 2),
                                          "dtmf": {"track": "inbound_track", "digit": digit}}))
            await phone.until("media")  # the reply to the entry
        assert len(engine.requests) == 1
        asked = engine.tokenizer.last_user_message(engine.requests[0].prompt)
        assert asked == "[The caller pressed on the phone's keypad: 1 2 #]"


def telnyx_media(audio: np.ndarray, first: int = 1) -> list[dict]:
    """The caller's audio as Telnyx's `media` messages: 20 ms of A-law each, numbered on from `first`."""
    coded = PCMA.encode(to_pcm16(audio))
    return [{"event": "media", "sequence_number": str(n + 1), "stream_id": "S1", "media": {
        "track": "inbound", "chunk": str(n), "timestamp": str(20 * (n - 1)),
        "payload": base64.b64encode(coded[i:i + 160]).decode()}}
            for n, i in enumerate(range(0, len(coded), 160), first)]


def telnyx_start(key: str | None = None, encoding: str = "PCMA") -> dict:
    return {"event": "start", "sequence_number": "1", "stream_id": "S1", "start": {
        "user_id": "U1", "call_control_id": "v3:C1", "from": "+13122010094", "to": "+13122123456",
        "custom_parameters": {"api_key": key} if key else {},
        "media_format": {"encoding": encoding, "sample_rate": 8000, "channels": 1}}}


async def test_a_telnyx_call_in_alaw_is_heard_answered_in_alaw_and_cleared_on_a_barge_in():
    async with fake_server(Limits(), reply=REPLY, heard="What is the capital of France?",
                           security=Security(KEY)) as (server, engine):
        status, _, body = await http_post(server, {}, path="/v1/telnyx/voice",
                                          headers={"Authorization": f"Bearer {KEY}"})
        assert status == 200 and "/v1/telnyx/media" in body.decode() and KEY in body.decode()
        async with connect(f"ws://127.0.0.1:{server.port}/v1/telnyx/media") as ws:
            phone = Phone(ws, telnyx_media)
            await ws.send(json.dumps({"event": "connected", "version": "1.0.0"}))
            await ws.send(json.dumps(telnyx_start(KEY)))
            await phone.say(np.concatenate([VOICE, np.zeros(8000, np.float32)]))
            first = await phone.until("media")
            assert "streamSid" not in first and len(base64.b64decode(first["media"]["payload"])) > 0
            await phone.say(VOICE)  # over the reply
            assert "streamSid" not in await phone.until("clear")
            await ws.send(json.dumps({"event": "stop", "sequence_number": "999", "stream_id": "S1"}))
            await asyncio.wait_for(phone.reader, 5)
        tone = PCMA.decode(b"".join(base64.b64decode(m["media"]["payload"]) for m in phone.of("media")))
        assert np.median(np.abs(tone.astype(np.int32))) == pytest.approx(1000, abs=100)  # A-law, not μ-law
        assert len(engine.requests) >= 2


async def test_a_telnyx_stream_in_a_codec_not_spoken_here_or_without_the_key_is_closed():
    async with fake_server(Limits(), security=Security(KEY)) as (server, _):
        for start, code in ((telnyx_start(KEY, "G722"), 1003), (telnyx_start("wrong"), 1008)):
            async with connect(f"ws://127.0.0.1:{server.port}/v1/telnyx/media") as ws:
                await ws.send(json.dumps(start))
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 5)
                assert closed.value.rcvd.code == code


def test_the_phone_leg_counts_lost_and_late_packets_fills_gaps_with_silence_and_estimates_jitter():
    from voicepipe.server.phone_leg import PhoneLeg

    leg = PhoneLeg()
    arrivals = {1: 0.00, 2: 0.02, 3: 0.045, 5: 0.085, 4: 0.09, 6: 0.10, 8: 0.14}  # 4 late, 7 never came
    gaps = [leg.packet(n, 20 * (n - 1), at) for n, at in arrivals.items()]
    assert gaps == [0, 0, 0, 1, None, 0, 1]  # silence where 4 and 7 were; 4 dropped when it came, too late
    assert leg.figures()["packets_received"] == 6 and (leg.lost, leg.late) == (1, 1)
    assert 0.5 < 1000 * leg.jitter_s < 3  # the arrivals wandered by 5-10 ms against the caller's clock
    steady = PhoneLeg()
    for n in range(1, 100):
        steady.packet(n, 20 * (n - 1), 0.02 * (n - 1) + 1.0)
    assert steady.jitter_s < 1e-9 and steady.lost == steady.late == 0


async def test_a_phone_call_s_lost_and_late_packets_are_counted_in_the_metrics():
    async with fake_server(Limits(), reply="Paris.", heard="What is the capital of France?") as (server, _):
        async with connect(f"ws://127.0.0.1:{server.port}/v1/twilio/media") as ws:
            await ws.send(json.dumps(start()))
            packets = media(np.concatenate([VOICE[:8000], np.zeros(8000, np.float32)]))
            packets[10], packets[11] = packets[11], packets[10]  # one arrives after the next: too late
            del packets[20]  # one never arrives
            for message in packets:
                await ws.send(json.dumps(message))
            await ws.send(json.dumps({"event": "stop", "streamSid": "MZ1", "stop": {"callSid": "CA1"}}))
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 5)
        metrics = generate_latest(server.runtime.registry).decode()
        assert 'voicepipe_phone_packets_total{outcome="lost",provider="twilio"} 1.0' in metrics
        assert 'voicepipe_phone_packets_total{outcome="late",provider="twilio"} 1.0' in metrics
        assert 'voicepipe_phone_jitter_seconds_count{provider="twilio"} 1.0' in metrics
