"""The server under abuse: random and malformed messages, connection storms, stalled and half-open clients,
a barge-in storm and a soak. Each runs a real server on a loopback port with real websockets clients,
and every loop is bounded.

After each test the server must be back where it started: no call left, no request or job in the engine,
the KV pool holding nothing but cached pages, no more asyncio tasks than before, and nothing logged as an
error.
"""

import asyncio
import base64
import json
import logging
import random
import time
from collections.abc import Callable

import numpy as np
import pytest
import pytest_asyncio
from support.helpers import FRAME, LONG_QUESTION, QUESTION, SAMPLE_RATE, Call, calls_ended, settled
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from voicepipe.audio import read_audio, to_pcm16
from voicepipe.call.limits import Limits
from voicepipe.call.native_serializer import NativeSerializer
from voicepipe.call.pipeline import build_pipeline
from voicepipe.cli import build_parser
from voicepipe.pipeline import CallConfig, Conversation
from voicepipe.pipeline.events import Event, TranscriptFinal
from voicepipe.pipeline.requests import CancelRequested
from voicepipe.server import VoiceServer
from voicepipe.server.settings import load_settings
from voicepipe.turns.turn_taking import TurnTaking

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_MESSAGE = 1 << 16  # a small limit, so oversized frames are quick to make
TRANSPORT_MAX = 4 * MAX_MESSAGE  # past this the websocket layer closes the connection (server.TRANSPORT_SLACK)
TOO_BIG, NOT_UTF8 = "close 1009", "close 1007"  # messages that end the connection, with these close codes
SEED = 7


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(runtime):
    server = VoiceServer(runtime, Limits(max_message_bytes=MAX_MESSAGE))
    await server.start(port=0)  # on the default host
    yield server
    await server.close()


@pytest.fixture(scope="module")
def question(speech_wav) -> np.ndarray:
    return read_audio(speech_wav(QUESTION), SAMPLE_RATE)


@pytest_asyncio.fixture(loop_scope="module")
async def baseline(server, runtime, caplog):
    """Wait for a quiet server; after the test, check that everything went back to how it was."""
    await calls_ended(server)
    await settled(runtime.engine)
    tasks = len(asyncio.all_tasks())
    caplog.set_level(logging.WARNING)
    yield
    await calls_ended(server)
    held = await settled(runtime.engine)
    assert held["pool_error"] is None
    assert not held["pinned"] and held["used_pages"] == held["cached_pages"], f"pages held after the calls: {held}"
    end = time.monotonic() + 10
    while len(asyncio.all_tasks()) > tasks:
        assert time.monotonic() < end, f"{len(asyncio.all_tasks()) - tasks} tasks leaked"
        await asyncio.sleep(0.05)
    errors = [r for r in caplog.get_records("call") + caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def url(server: VoiceServer) -> str:
    return f"ws://127.0.0.1:{server.port}/ws"


async def answered(server: VoiceServer, question: np.ndarray) -> str:
    """A new call asks the question; returns the transcript once the reply is complete."""
    call = await Call.open(server)
    try:
        await call.speak(question)
        transcript = (await call.wait("conversation.item.input_audio_transcription.completed"))["transcript"]
        assert (await call.wait("response.done"))["response"]["status"] == "completed"
        assert call.frames and not call.of("error")
    finally:
        await call.close()
    return transcript


async def streaming_silence(call: Call, until: Callable[[], object], timeout: float = 240) -> None:
    """Send silence in real time, as an open microphone does, until `until()` holds."""
    silence = bytes(2 * FRAME)
    start = time.monotonic()
    for i in range(int(timeout / 0.02)):
        if until():
            return
        await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))
        await call.ws.send(silence)
    raise AssertionError("timed out")


# -- random and malformed messages ---------------------------------------------------------------------------
def random_json(rng: random.Random, depth: int = 0) -> object:
    """Any JSON value, nested up to three deep (NaN and Infinity included: Python's parser takes them)."""
    kind = rng.choice("nfsbzlo" if depth < 3 else "nfsbz")
    if kind == "n":
        return rng.randint(-(10**12), 10**12)
    if kind == "f":
        return rng.choice([rng.uniform(-1e6, 1e6), float("inf"), float("nan")])
    if kind == "s":
        return "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 20)))
    if kind == "b":
        return rng.random() < 0.5
    if kind == "z":
        return None
    if kind == "l":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {str(random_json(rng, 3)): random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def not_a(rng: random.Random, *kinds: type) -> object:
    """A random JSON value that is none of `kinds` (bool counts as its own kind)."""
    while True:
        value = random_json(rng)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds and int in kinds):
            return value


def bad_message(rng: random.Random) -> tuple[str | bytes, str | None]:
    """One bad message and the error code it must get (None: harmless, no answer), or how it closes."""
    odd = rng.randrange(1, 2000, 2)
    choices: list[Callable[[], tuple[str | bytes, str | None]]] = [
        lambda: (rng.randbytes(odd), "invalid_audio"),
        lambda: (b"", None),  # no samples: nothing to do
        lambda: ("", "invalid_json"),
        lambda: ("~" + "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(0, 50))), "invalid_json"),
        lambda: ("[" * 5000 + "]" * 5000, "invalid_json"),
        lambda: ('{"type":"session.update","session":' * 1500 + "{}" + "}" * 1500, "invalid_json"),
        lambda: ('{"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": 1' + "0" * 5000
                 + "}}}", "invalid_json"),  # more digits than Python converts
        lambda: (json.dumps(not_a(rng, dict)), "invalid_event"),
        lambda: (json.dumps({"type": not_a(rng, str)}), "invalid_event"),
        lambda: (json.dumps({"type": "x." + str(rng.random()), "audio": random_json(rng)}), "unknown_event"),
        lambda: (json.dumps({"type": "input_audio_buffer.append", "audio": not_a(rng, str)}), "invalid_audio"),
        lambda: (json.dumps({"type": "input_audio_buffer.append", "audio": "no base64!"}), "invalid_audio"),
        lambda: (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(rng.randbytes(odd))
                             .decode()}), "invalid_audio"),
        lambda: (json.dumps({"type": "session.update", "session": not_a(rng, dict)}), "invalid_session_update"),
        lambda: (json.dumps({"type": "session.update", "session": {"instructions": not_a(rng, str)}}),
                 "invalid_session_update"),
        lambda: (json.dumps({"type": "session.update", "session": {"instructions": "Be brief.\ud800"}}),
                 "invalid_session_update"),  # a lone surrogate: no tokenizer can encode it
        lambda: (json.dumps({"type": "session.update", "session": {"turn_detection": {
            rng.choice(["threshold", "prefix_padding_ms", "silence_duration_ms"]): not_a(rng, int, float)}}}),
                 "invalid_session_update"),
        lambda: (json.dumps({"type": "session.update", "session": {"scheduler": {
            rng.choice(["max_batch_tokens", "max_batch_seqs", "self", "x"]): not_a(rng, int, float)}}}),
                 "invalid_session_update"),
        lambda: (json.dumps({"type": "session.update", "session": {"voice": random_json(rng)}}),
                 "invalid_session_update"),
        lambda: (rng.randbytes(rng.randrange(MAX_MESSAGE + 2, TRANSPORT_MAX, 2)), "message_too_large"),
        lambda: (json.dumps({"type": "x" * rng.randrange(MAX_MESSAGE, TRANSPORT_MAX - 100)}), "message_too_large"),
    ]
    if rng.random() < 0.03:  # these end the connection: the client reconnects and goes on
        return rng.choice([(bytes(TRANSPORT_MAX + 2), TOO_BIG), (b"\xff\xfe not UTF-8", NOT_UTF8)])
    return rng.choice(choices)()


async def fuzz(server: VoiceServer, messages: list[tuple[str | bytes, str | None]]) -> int:
    """Send the messages one by one, checking each one's error; returns how many connections ended."""
    call, closes, answered_errors = await Call.open(server), 0, 0
    try:
        for message, expected in messages:
            if expected in (TOO_BIG, NOT_UTF8):
                await call.ws.send(message, text=expected == NOT_UTF8)  # the bytes as they are, in a text frame
                await asyncio.wait_for(call._reader, 30)
                assert f"close {call.ws.close_code}" == expected
                closes += 1
                call, answered_errors = await Call.open(server), 0
                continue
            await call.send(message)
            if expected is None:
                continue
            end = time.monotonic() + 30
            while len(call.of("error")) <= answered_errors:
                assert not call.closed and time.monotonic() < end, f"no error for {str(message)[:80]!r}"
                await asyncio.sleep(0.005)
            error = call.of("error")[answered_errors]["error"]
            answered_errors += 1
            assert error["code"] == expected and error["message"], (str(message)[:200], error)
    finally:
        await call.close()
    return closes


async def test_random_and_malformed_messages(server, runtime, question, words, baseline):
    """300 seeded random bad messages, each answered by its own error event or a clean close, while a
    second client's spoken turn completes undisturbed."""
    knobs = (runtime.engine.config.max_batch_tokens, runtime.engine.config.max_batch_seqs)
    rng = random.Random(SEED)
    messages = [bad_message(rng) for _ in range(300)]
    good = await Call.open(server)
    try:
        fuzzing = asyncio.create_task(fuzz(server, messages))
        await good.speak(question)
        transcript = (await good.wait("conversation.item.input_audio_transcription.completed"))["transcript"]
        done = (await good.wait("response.done"))["response"]
        closes = await fuzzing
    finally:
        await good.close()
    assert {"capital", "france"} <= words(transcript)
    assert done["status"] == "completed" and good.frames and not good.of("error")
    assert closes >= 1
    assert (runtime.engine.config.max_batch_tokens, runtime.engine.config.max_batch_seqs) == knobs  # none applied


# -- connections that come and go ---------------------------------------------------------------------------
async def test_connection_storm(server, question, words, baseline):
    """50 connections opened and dropped: at once, after the greeting, or mid-utterance, some without a
    closing handshake. Calls over the limit are refused; the server then answers a new call."""
    speech = to_pcm16(question[: len(question) // 2]).astype("<i2").tobytes()
    for i in range(50):
        ws = await connect(url(server), max_size=None)
        if i % 5 >= 2:
            greeting = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert greeting["type"] == "session.created" or greeting["error"]["code"] == "too_many_calls"
        if i % 5 >= 3:
            try:
                for offset in range(0, len(speech), 2 * FRAME):  # half a question, faster than real time
                    await ws.send(speech[offset:offset + 2 * FRAME])
            except ConnectionClosed:  # a refused call
                pass
        if i % 2:
            ws.transport.abort()  # gone, without a closing handshake
        await ws.close()
    await calls_ended(server, timeout=5)  # their slots are free again at once (until then, 1013: try later)
    assert {"capital", "france"} <= words(await answered(server, question))


async def test_half_open_and_stalled_clients(server, question, words, baseline):
    """A socket stuck halfway through its HTTP upgrade, and a call that stops reading while its reply
    streams, hold nothing the other calls need; the half-open one is dropped when the handshake times out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")  # and never the rest
    stalled = await Call.open(server)
    try:
        speaking = asyncio.create_task(stalled.speak(question))
        await stalled.wait("input_audio_buffer.speech_started", timeout=30)
        stalled.ws.transport.pause_reading()  # it goes on sending, and reads nothing more
        assert {"capital", "france"} <= words(await answered(server, question))
        await speaking
        assert await asyncio.wait_for(reader.read(), 30) == b""  # the server hung up on the half-open socket
        assert len(server.calls) == 1
    finally:
        writer.close()
        stalled.ws.transport.resume_reading()
        await stalled.close()


async def test_barge_in_storm(server, speech_wav, question, words, baseline):
    """Speech and silence alternate quickly while replies stream: every reply is created and done exactly
    once, nothing errs, the call still answers in the end, and so does a new call."""
    rng = random.Random(SEED)
    call = await Call.open(server)
    try:
        await call.speak(read_audio(speech_wav(LONG_QUESTION), SAMPLE_RATE), silence_s=0.6)
        await call.wait("response.audio.delta")
        interruption = read_audio(speech_wav("No, wait."), SAMPLE_RATE)
        for _ in range(8):
            await call.speak(interruption, silence_s=rng.uniform(0.6, 2.0))
        mark = len(call.events)
        await call.speak(question)
        last = (await call.wait("response.created", start=mark))["response"]["id"]
        assert (await call.wait("response.done", response=last))["response"]["status"] == "completed"
    finally:
        await call.close()
    created = [e["response"]["id"] for e in call.of("response.created")]
    done = [e["response"]["id"] for e in call.of("response.done")]
    assert len(created) >= 3 and sorted(created) == sorted(done) and len(set(done)) == len(done)
    assert sum(e["response"]["status"] == "cancelled" for e in call.of("response.done")) >= 2
    assert call.of("output_audio_buffer.cleared") and not call.of("error")
    assert {"capital", "france"} <= words(await answered(server, question))


# -- a soak ------------------------------------------------------------------------------------------------
async def test_soak(server, runtime, question, baseline):
    """Two callers take turns for up to about a minute, their microphones streaming silence between turns.
    While a call lasts its KV pages are its conversation's prefix, replaced (not piled up) turn after turn;
    once both hang up the pool holds only cached pages (checked after the test)."""
    engine, stop_at = runtime.engine.core, time.monotonic() + 45

    async def caller() -> list[int]:
        call, pinned = await Call.open(server), []
        session = next(s for s in server.calls if s.id == call.session_id)
        try:
            while len(pinned) < 3 and time.monotonic() < stop_at:
                mark = len(call.events)
                await call.speak(question)
                await streaming_silence(call, replied(call, mark))
                assert (await call.wait("response.done", start=mark))["response"]["status"] == "completed"
                await streaming_silence(call, lambda: session.id in engine.pool.pins, timeout=30)
                pinned.append(len(engine.pool.pins[session.id][0]))
                conversation = len(session.conversation.prompt_ids(session.config.max_prompt_tokens))
                assert pinned[-1] <= engine.pool.pages_for(conversation), (pinned, conversation)
                assert len(engine.pool.pins) <= 2
            assert not call.of("error")
        finally:
            await call.close()
        return pinned

    for pinned in await asyncio.gather(caller(), caller()):
        assert len(pinned) >= 2 and pinned == sorted(pinned), pinned


def replied(call: Call, start: int) -> Callable[[], bool]:
    """Whether a response has ended since event `start`."""
    return lambda: any(e["type"] == "response.done" for e in call.events[start:])


async def test_the_server_listens_on_loopback_unless_told_otherwise(server):
    assert server.sockets[0].getsockname()[0] == "127.0.0.1"
    assert load_settings(build_parser().parse_args(["serve"]), environ={}).host == "127.0.0.1"


async def test_audio_faster_than_real_time_is_slowed_down(server, question, baseline):
    """A client sending audio as fast as the network carries it (here 400 s of it) is read only as fast as
    the VAD endpoints it: the call's backlog stays small instead of growing with everything sent."""
    call = await Call.open(server)
    session = next(s for s in server.calls if s.id == call.session_id)
    backlog = [0]

    async def watch() -> None:
        while True:
            backlog[0] = max(backlog[0], session.pipeline.queues[0].qsize())
            await asyncio.sleep(0.001)

    watching = asyncio.create_task(watch())
    try:
        frame = to_pcm16(np.zeros(MAX_MESSAGE // 2, np.float32)).tobytes()  # 2 s of silence per message
        for _ in range(200):
            await call.ws.send(frame)
        mark = len(call.events)
        await call.send({"type": "session.update", "session": {}})
        await call.wait("session.updated", timeout=60, start=mark)  # read after all of it: the call goes on
    finally:
        watching.cancel()
        await call.close()
    assert backlog[0] <= 16, backlog[0]


async def test_a_cancel_in_the_same_instant_as_the_transcript(runtime, baseline):
    """The client cancels in the very instant the caller's transcript is final: the turn it started is
    cancelled before its task ever ran, and the client still hears of it in order (created, then done)."""
    sent: list[dict] = []
    native = NativeSerializer(Limits().max_message_bytes)

    async def send(*events: Event) -> None:
        sent.extend(m for event in events for m in native.render(event) if isinstance(m, dict))

    config = CallConfig()
    conversation = Conversation(config.instructions, runtime.tokenizer)
    pipeline = build_pipeline(runtime, "sess_instant", config, conversation, send)
    pipeline.start()
    try:
        now = time.monotonic()
        turns = pipeline.queues[next(i for i, s in enumerate(pipeline.stages) if isinstance(s, TurnTaking))]
        # Both wait in turn-taking's inbox together, so the LLM stage gets the transcript, the verdict to
        # answer it and the cancel one right after the other.
        turns.put_nowait(TranscriptFinal("item_1", "What is the capital of France?", now, 0.1))
        turns.put_nowait(CancelRequested())
        end = time.monotonic() + 30
        while not any(m["type"] == "response.done" for m in sent):
            assert time.monotonic() < end, sent
            await asyncio.sleep(0.01)
    finally:
        await pipeline.stop()
        runtime.engine.release_session("sess_instant")
    kinds = [m["type"] for m in sent if m["type"].startswith("response.")]
    assert kinds == ["response.created", "response.done"], kinds
