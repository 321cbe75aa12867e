"""G.711 (μ-law and A-law at 8 kHz), as phone lines and telephony bridges carry audio: the codec against
known vectors and the standard library's reference tables, and the Realtime API speaking it both ways
over the fake engine (milliseconds)."""

import asyncio
import base64
import json
import warnings

import numpy as np
import pytest
from support.fake_transport import QueueTransport
from support.fake_transport import realtime as realtime_line
from support.fakes import FakeASR, FakeEngine, FakeTokenizer, FakeTTS

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.wire_audio import PCMA, PCMU

with warnings.catch_warnings():  # deprecated, and gone in Python 3.13: the reference here, nowhere else
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

CODECS = {"pcmu": (PCMU, audioop.ulaw2lin), "pcma": (PCMA, audioop.alaw2lin)}
LOUD = (np.random.default_rng(0).standard_normal(8000) * 8000).clip(-32768, 32767).astype(np.int16)


@pytest.mark.parametrize("coding, vectors", [("pcmu", "ff8000"), ("pcma", "d5aa2a")])
def test_g711_codes_silence_and_the_extremes_as_the_standard_does(coding, vectors):
    codec, _ = CODECS[coding]
    assert codec.encode(np.array([0, 32767, -32768], np.int16)).hex() == vectors


@pytest.mark.parametrize("coding", CODECS)
def test_g711_decodes_every_code_as_the_reference_and_encodes_within_a_step(coding):
    codec, reference = CODECS[coding]
    every = bytes(range(256))
    assert np.array_equal(codec.decode(every), np.frombuffer(reference(every, 2), "<i2"))
    coded = codec.encode(LOUD)
    assert len(coded) == len(LOUD)  # one byte a sample, any chunk on its own
    levels = np.sort(np.unique(codec.decode(every).astype(np.int64)))
    decoded = codec.decode(coded).astype(np.int64)
    at = np.clip(np.searchsorted(levels, decoded), 1, len(levels) - 1)
    step = np.maximum(levels[at] - levels[at - 1], levels[np.minimum(at + 1, len(levels) - 1)] - levels[at])
    assert np.all(np.abs(decoded - LOUD) <= step)  # within the quantizer's step at that loudness


async def phone_call(beta: bool = False):
    engine = FakeEngine(FakeTokenizer(), {}, asr=FakeASR(""), tts=FakeTTS())
    runtime = Runtime(engine, engine.tokenizer, "fake-model", 16000, FakeTTS.sample_rate)
    client = QueueTransport()
    session = Session(realtime_line(client, runtime, beta=beta), runtime, Limits())
    return client, asyncio.create_task(session.run())


@pytest.mark.parametrize("beta", [False, True])
async def test_a_realtime_session_in_g711_hears_and_answers_at_8_khz(beta):
    client, served = await phone_call(beta)
    fmt = "g711_ulaw" if beta else {"type": "audio/pcmu"}
    try:
        await client.until("session.created")
        update = {"input_audio_format": fmt, "output_audio_format": fmt} if beta else \
            {"type": "realtime", "audio": {"input": {"format": fmt}, "output": {"format": fmt}}}
        client.put({"type": "session.update", "session": update})
        session = (await client.until("session.updated"))["session"]
        assert (session["input_audio_format"], session["output_audio_format"]) == (fmt, fmt) if beta else \
            (session["audio"]["input"]["format"], session["audio"]["output"]["format"]) == (fmt, fmt)
        client.put({"type": "input_audio_buffer.append", "audio": base64.b64encode(PCMU.encode(LOUD[:801])).decode()})
        client.put({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Hello?"}]}}, {"type": "response.create"})
        done = await client.until("response.done")
        assert not client.events("error")  # an odd number of G.711 bytes is whole samples
        deltas = [e for e in client.events() if e["type"].endswith("audio.delta")]
        coded = b"".join(base64.b64decode(e["delta"]) for e in deltas)
        words = len(done["response"]["output"][0]["content"][0]["transcript"].split())
        assert abs(len(coded) - words * 800) <= 160  # a tenth of a second a word, at 8000 bytes a second
        assert np.abs(PCMU.decode(coded)[100:-100].astype(np.int32) - 1000).max() < 200  # the fake's tone
        if not beta:
            assert done["response"]["audio"]["output"]["format"] == fmt
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)


async def test_an_audio_format_the_server_does_not_code_is_refused_and_the_call_goes_on():
    client, served = await phone_call()
    try:
        await client.until("session.created")
        client.put({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000}}}}}, {"type": "session.update", "session": {
                "type": "realtime", "audio": {"output": {"format": {"type": "audio/pcma"}}}}})
        error = await client.until("error")
        assert error["error"]["code"] == "unsupported_session" and "audio/pcmu" in error["error"]["message"]
        session = (await client.until("session.updated"))["session"]
        assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}  # unchanged
        assert session["audio"]["output"]["format"] == {"type": "audio/pcma"}
        assert json.dumps(session)  # as sent
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)


async def test_a_key_pressed_reaches_a_realtime_client_in_the_realtime_shape():
    from test_conformance import GA_EVENTS, violations

    client, served = await phone_call()
    try:
        await client.until("session.created")
        client.put({"type": "input_audio_buffer.dtmf", "digit": "#"})
        received = await client.until("input_audio_buffer.dtmf_event_received")
        assert received["event"] == "#" and not violations(received, GA_EVENTS)
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)
