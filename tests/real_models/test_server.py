"""The server end to end: a real websockets server on a loopback port, the real models, real clients.

Speech is espeak-ng audio streamed in 20 ms frames in real time, as a microphone would send it. The server
runs on this test module's event loop, so its tasks can be counted; its engine runs in a process of its
own, as `serve` runs it, and what it holds is read through the channel.
"""

import asyncio
import base64

import numpy as np
import pytest
import pytest_asyncio
from support.helpers import (
    FRAME,
    LONG_QUESTION,
    QUESTION,
    SAMPLE_RATE,
    Call,
    calls_ended,
    http_get,
    pinned_pages,
    reply_text,
    response_id,
    settled,
)
from websockets.asyncio.client import connect

from voicepipe.audio import read_audio, resample, to_float32
from voicepipe.backends.loading import ASR_PARTIAL, ModelOptions
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.server import VoiceServer

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime():
    """The embedded models in an engine process (float32, as the in-process fixture's)."""
    runtime = await Runtime.spawn(ModelOptions(llm_precision="fp32"))
    yield runtime
    await runtime.close()


@pytest.fixture(scope="module")
def question(speech_wav) -> np.ndarray:
    return read_audio(speech_wav(QUESTION), SAMPLE_RATE)


async def test_spoken_question_is_answered(server, runtime, question, words):
    call = await Call.open(server)
    try:
        await call.speak(question)
        started = await call.wait("input_audio_buffer.speech_started")
        stopped = await call.wait("input_audio_buffer.speech_stopped")
        assert stopped["item_id"] == started["item_id"]
        assert stopped["audio_end_ms"] > started["audio_start_ms"]
        transcript = (await call.wait("conversation.item.input_audio_transcription.completed"))["transcript"]
        assert {"capital", "france"} <= words(transcript)
        done = (await call.wait("response.done"))["response"]
    finally:
        await call.close()
    assert done["status"] == "completed"
    timings = done["timings"]
    assert set(timings) >= {"transcript_s", "end_confirmed_s", "reply_started_s", "first_token_s",
                            "first_phrase_s", "synthesized_s", "first_audio_s"}
    # A reply may start, and write its first token, at the caller's pause, before the end of speech is
    # confirmed; its audio never goes out before then. Every time counts from the caller's last word.
    assert timings["reply_started_s"] <= timings["first_token_s"] <= timings["first_audio_s"]
    assert 0 < timings["transcript_s"] <= timings["first_audio_s"]
    assert 0 < timings["end_confirmed_s"] <= timings["first_audio_s"]
    assert sum(done["waterfall"].values()) == pytest.approx(timings["first_audio_s"], abs=1e-3)
    assert isinstance(done["deadline_met"], bool) and isinstance(done["underruns"], int)

    answer = reply_text(call, done["id"])
    assert len(call.of("response.text.delta")) > 1 and answer.strip()
    assert call.frames, "no reply audio"
    for meta, frame in call.frames:
        assert meta["type"] == "response.audio.delta" and meta["bytes"] == len(frame)
    rate = call.frames[0][0]["sample_rate"]
    reply = resample(to_float32(np.frombuffer(b"".join(f for _, f in call.frames), "<i2")), rate, SAMPLE_RATE)
    heard = await runtime.engine.run_job(ASR_PARTIAL, reply)
    said = words(answer)
    assert len(words(heard) & said) >= max(2, len(said) // 3), (heard, answer)


async def test_barge_in_cancels_the_reply(server, runtime, speech_wav, words):
    call = await Call.open(server)
    try:
        await call.speak(read_audio(speech_wav(LONG_QUESTION), SAMPLE_RATE))
        first = response_id(await call.wait("response.created"))
        await call.wait("response.audio.delta", response=first)
        mark = len(call.events)
        await call.speak(read_audio(speech_wav("Stop. Tell me something else."), SAMPLE_RATE))
        await call.wait("output_audio_buffer.cleared", start=mark, response=first)
        cancelled = (await call.wait("response.done", start=mark, response=first))["response"]
        assert cancelled["status"] == "cancelled"
        second = response_id(await call.wait("response.created", start=mark))
        assert second != first
        await call.send({"type": "response.cancel"})
        ended = (await call.wait("response.done", start=mark, response=second))["response"]["status"]
        if ended == "completed":  # a short reply written in full before the cancel came: its audio stops
            await call.wait("output_audio_buffer.cleared", start=mark, response=second)
        else:
            assert ended == "cancelled"

        # The conversation keeps only the words the caller heard before speaking over them.
        session = next(s for s in server.calls if s.id == call.session_id)
        heard = next(i for i in session.conversation.items if i["role"] == "assistant")["content"]
        full = reply_text(call, first)
        assert len(heard.split()) < len(full.split()) and words(heard) <= words(full)

        held = await settled(runtime.engine)
        assert held["pool_error"] is None
        assert session.id in held["pinned"]  # the conversation prefix is kept for the next turn...
        assert held["used_pages"] == pinned_pages(held) + held["cached_pages"]  # ...and nothing else is held
    finally:
        await call.close()


async def test_two_calls_at_once(server, question):
    calls = [await Call.open(server), await Call.open(server)]
    try:
        await asyncio.gather(*(c.speak(question) for c in calls))
        done = await asyncio.gather(*(c.wait("response.done") for c in calls))
    finally:
        await asyncio.gather(*(c.close() for c in calls))
    for call, event in zip(calls, done, strict=True):
        assert event["response"]["status"] == "completed"
        assert call.frames and reply_text(call, event["response"]["id"]).strip()


async def test_bad_messages_get_errors_and_the_calls_go_on(server, runtime):
    await calls_ended(server)
    bystander, call = await Call.open(server), await Call.open(server)
    try:
        config = (runtime.engine.config.max_batch_tokens, runtime.engine.config.max_batch_seqs)
        bad = [
            ("not json", "invalid_json"),
            ("[1, 2]", "invalid_event"),
            ({"type": "conversation.nonsense"}, "unknown_event"),
            (b"\x00" * (server.limits.max_message_bytes + 2), "message_too_large"),
            (b"\x00\x01\x02", "invalid_audio"),
            ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_audio"),
            ({"type": "session.update", "session": {"turn_detection": {"silence_duration_ms": 800},
                                                    "scheduler": {"max_batch_tokens": 0}}}, "invalid_session_update"),
            ({"type": "session.update", "session": {"turn_detection": {"threshold": "x"}}}, "invalid_session_update"),
            ({"type": "session.update", "session": {"voice": "alloy"}}, "invalid_session_update"),
            ({"type": "response.create", "response": {"metadata": {"client_event_id": 7}}}, "invalid_metadata"),
            ({"type": "response.create", "response": {"metadata": {str(n): "x" for n in range(17)}}},
             "invalid_metadata"),
        ]
        for message, code in bad:
            mark = len(call.events)
            await call.send(message)
            error = await call.wait("error", timeout=30, start=mark)
            assert error["error"]["code"] == code, (message if len(message) < 200 else "big", error)
            assert error["error"]["message"]
        # Nothing of a refused update was applied...
        session = next(s for s in server.calls if s.id == call.session_id)
        assert session.config.turn_detection.silence_duration_ms == 500
        assert (runtime.engine.config.max_batch_tokens, runtime.engine.config.max_batch_seqs) == config
        # ...and both calls still answer.
        mark = len(call.events)
        await call.send({"type": "input_audio_buffer.append",
                         "audio": base64.b64encode(bytes(2 * FRAME)).decode()})
        await call.send({"type": "session.update",
                         "session": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 600}}})
        updated = await call.wait("session.updated", timeout=30, start=mark)
        assert updated["session"]["turn_detection"]["silence_duration_ms"] == 600
        assert not call.of("error")[len(bad):]
        mark = len(bystander.events)
        await bystander.send({"type": "session.update", "session": {}})
        await bystander.wait("session.updated", timeout=30, start=mark)
        assert not bystander.of("error")

        # One call too many is told so, and closed with 1013 (try again later).
        third = await Call.open(server)
        extra = Call(await connect(f"ws://127.0.0.1:{server.port}/ws"))
        try:
            error = await extra.wait("error", timeout=30)
            assert error["error"]["code"] == "too_many_calls"
            await extra._reader
            assert extra.ws.close_code == 1013
            mark = len(third.events)
            await third.send({"type": "session.update", "session": {}})
            await third.wait("session.updated", timeout=30, start=mark)
        finally:
            await third.close()
            await extra.close()
    finally:
        await asyncio.gather(call.close(), bystander.close())


async def test_a_vanishing_client_leaks_nothing(server, runtime, question):
    await calls_ended(server)
    await settled(runtime.engine)
    tasks_before = len(asyncio.all_tasks())
    call = await Call.open(server)
    await call.speak(question)
    await call.wait("response.created")
    call.ws.transport.abort()  # gone mid-turn, without a closing handshake
    await call._reader

    await calls_ended(server)
    held = await settled(runtime.engine)
    assert held["pool_error"] is None and call.session_id not in held["pinned"]
    assert held["used_pages"] == pinned_pages(held) + held["cached_pages"]
    assert len(asyncio.all_tasks()) == tasks_before


async def test_http(server):
    status, headers, body = await http_get(server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and b"<html" in body.lower()
    status, headers, _ = await http_get(server, "/app.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript")
    status, headers, body = await http_get(server, "/metrics")
    assert status == 200 and b"voicepipe_time_to_first_token_seconds" in body
    for path in ("/../pyproject.toml", "/%2e%2e/pyproject.toml", "/..%2fpyproject.toml", "/missing.html",
                 "/__init__.py"):
        status, _, body = await http_get(server, path)
        assert status == 404, path
        assert b"voicepipe" not in body


async def test_idle_and_overlong_utterances_are_reported(runtime, question):
    strict = VoiceServer(runtime, Limits(idle_timeout_s=5.0, max_utterance_s=1.0))
    await strict.start("127.0.0.1", 0)
    try:
        call = await Call.open(strict)
        await call.speak(question, silence_s=0.6)
        error = await call.wait("error", timeout=30)
        assert error["error"]["code"] == "utterance_too_long"
        await call.wait("conversation.item.input_audio_transcription.completed")
        error = await call.wait("error", start=call.events.index(error) + 1)
        assert error["error"]["code"] == "idle_timeout"
        await call._reader
        assert call.ws.close_code == 1000
    finally:
        await strict.close()
