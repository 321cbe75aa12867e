"""A caller who goes quiet: `turn_detection.idle_timeout_ms` re-prompts them after a reply has played,
counted on their audio's clock; after `idle_prompts` unanswered re-prompts a goodbye ends the call."""

import asyncio
import base64

import numpy as np
import pytest
from support.fake_call import Call
from support.fake_transport import QueueTransport, native
from support.fake_transport import realtime as realtime_line
from support.fakes import FakeASR, FakeEngine, FakeTokenizer, FakeTTS

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.pipeline.detection import TurnDetection, check_update
from voicepipe.pipeline.events import IdleTimedOut
from voicepipe.protocol import ClientEvent, ServerEvent
from voicepipe.turns.idle import IdleSpan, IdleWatch

QUESTION = "What is the capital of France?"
TEXT_ITEM = {"type": ClientEvent.ITEM_CREATE,
             "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}}


def silence(seconds: float) -> bytes:
    return bytes(2 * int(seconds * 16000))


def test_the_countdown_runs_on_the_callers_audio_from_the_later_of_speech_and_reply_and_stops_at_speech():
    idle = IdleWatch()
    assert idle.tick(60_000, 1000) is None  # nothing said yet by either side: nothing to wait for
    idle.quiet_from(2000)  # the caller's words ended
    idle.quiet_from(5000)  # the reply's audio ends later
    idle.quiet_from(4000)  # an earlier chunk's end moves nothing back
    assert idle.tick(5999, 1000) is None
    assert idle.tick(6000, 1000) == IdleSpan(5000, 6000, 0)
    assert idle.tick(9000, 1000) is None  # once per silence
    idle.quiet_from(9000)
    assert idle.tick(10_500, 1000) == IdleSpan(9000, 10_000, 1)  # the second in a row; it ran out at 10 s
    idle.quiet_from(11_000)
    assert idle.tick(12_000, None) is None  # turned off
    idle.speech()
    idle.quiet_from(13_000)
    assert idle.tick(14_000, 1000) == IdleSpan(13_000, 14_000, 0)  # they spoke: the count starts again


def test_idle_settings_are_checked():
    current = TurnDetection()
    assert check_update({"idle_timeout_ms": 5000, "idle_prompts": None}, current) == {
        "idle_timeout_ms": 5000, "idle_prompts": None}
    for bad in ({"idle_timeout_ms": 10}, {"idle_timeout_ms": 2.5e3}, {"idle_timeout_ms": True},
                {"idle_prompts": -1}, {"idle_prompts": "2"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            check_update(bad, current)


async def serve(realtime: bool = False):
    engine = FakeEngine(FakeTokenizer(), {QUESTION: "Paris."}, asr=FakeASR(""), tts=FakeTTS())
    runtime = Runtime(engine, engine.tokenizer, "fake-model", 16000, 16000)
    client = QueueTransport()
    line = realtime_line(client, runtime) if realtime else native(client)
    call = Session(line, runtime, Limits())
    return client, engine, asyncio.create_task(call.run())


async def test_an_idle_caller_is_reprompted_then_told_goodbye_and_hung_up_on():
    client, engine, served = await serve()
    try:
        await client.until(ServerEvent.SESSION_CREATED)
        client.put({"type": ClientEvent.SESSION_UPDATE, "session": {"turn_detection": {
            "type": "server_vad", "idle_timeout_ms": 2000, "idle_prompts": 1}}})
        await client.until(ServerEvent.SESSION_UPDATED)
        assert client.events(ServerEvent.SESSION_UPDATED)[0]["session"]["turn_detection"]["idle_timeout_ms"] == 2000
        client.put(silence(5.0))  # before anyone spoke: no countdown
        client.put(TEXT_ITEM, {"type": ClientEvent.RESPONSE_CREATE})
        await client.until(ServerEvent.RESPONSE_DONE)
        await asyncio.sleep(0.1)  # the reply's audio, told upstream, reaches the VAD
        client.put(silence(1.5))
        await asyncio.sleep(0.1)
        assert not client.events(ServerEvent.AUDIO_TIMEOUT)  # not yet 2 s past the reply's end
        client.put(silence(1.5))
        timeout = await client.until(ServerEvent.AUDIO_TIMEOUT)
        assert timeout["audio_end_ms"] - timeout["audio_start_ms"] == 2000
        await client.until(ServerEvent.RESPONSE_DONE, 2)  # the re-prompt
        assert "said nothing" in engine.tokenizer.last_message(engine.requests[-1].prompt)
        assert client.closed is None
        client.put(silence(3.0))
        await client.until(ServerEvent.AUDIO_TIMEOUT, 2)
        await client.until(ServerEvent.RESPONSE_DONE, 3)  # the goodbye, then the line goes dead
        assert "goodbye" in engine.tokenizer.last_message(engine.requests[-1].prompt)
        await asyncio.wait_for(served, 5)
        assert client.closed == (1000, "the caller stayed silent")
        assert len(engine.requests) == 3 and all(r.closed for r in engine.requests)
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)


async def test_the_goodbye_comes_once_idle_prompts_reprompts_went_unanswered_and_never_without_a_limit():
    call = Call(reply="Paris.")
    last_prompt = lambda: call.tokenizer.last_message(call.engine.requests[-1].prompt)  # noqa: E731
    try:
        call.config.turn_detection.idle_prompts = None
        await call.push(IdleTimedOut("item_a", 0, 2000, 5, 0.0))
        assert "said nothing" in last_prompt() and len(call.client.of(ServerEvent.AUDIO_TIMEOUT)) == 1
        call.config.turn_detection.idle_prompts = 6
        await call.push(IdleTimedOut("item_b", 0, 2000, 5, 0.0))
        assert "said nothing" in last_prompt()
        await call.push(IdleTimedOut("item_c", 0, 2000, 6, 0.0))
        assert "goodbye" in last_prompt() and len(call.client.of(ServerEvent.RESPONSE_DONE)) == 3
        assert not any("[The caller" in m["content"] for m in call.conversation.messages())  # never joined it
    finally:
        await call.close()


async def test_a_timeout_while_a_reply_is_on_its_way_is_let_pass():
    call = Call()
    call.engine.gate.clear()  # the reply to the question waits
    try:
        await call.utterance()
        requests = len(call.engine.requests)
        await call.push(IdleTimedOut("item_a", 0, 2000, 0, 0.0))
        assert not call.client.of(ServerEvent.AUDIO_TIMEOUT) and len(call.engine.requests) == requests
    finally:
        call.engine.gate.set()
        await call.close()


async def test_the_realtime_api_hears_of_the_timeout_under_its_own_name():
    client, _, served = await serve(realtime=True)
    try:
        await client.until("session.created")
        client.put({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "idle_timeout_ms": 1000}}}}})
        updated = await client.until("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 1000
        client.put(TEXT_ITEM, {"type": "response.create"})
        await client.until("response.done")
        await asyncio.sleep(0.1)  # the reply's audio, told upstream, reaches the VAD
        pcm24k = np.zeros(24000 * 3, "<i2").tobytes()
        client.put({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm24k).decode()})
        timeout = await client.until("input_audio_buffer.timeout_triggered")
        assert set(timeout) >= {"event_id", "item_id", "audio_start_ms", "audio_end_ms"}
        await client.until("response.done", 2)
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)
