"""A function the client runs that takes its time: the caller hears a few words instead of silence, the
answer when the result comes, and the function's time is learnt for the next call. Over the fake engine
and a Session, with the client's function taking 1.5 s."""

import asyncio
import time

from support.fake_transport import QueueTransport, native
from support.fakes import FakeASR, FakeEngine, FakeTokenizer, FakeTTS

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.constrained import tools
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.llm_stage import LLMStage
from voicepipe.pipeline.tool_wait import GRACE_S, ToolWait
from voicepipe.protocol import ClientEvent, ServerEvent

QUESTION = "When does my train leave?"
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
ASK = [{"type": ClientEvent.ITEM_CREATE, "item": {"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": QUESTION}]}}, {"type": ClientEvent.RESPONSE_CREATE}]


def test_a_filler_is_due_at_once_when_the_function_is_expected_to_outlast_the_slack_and_its_time_is_learnt():
    wait = ToolWait()
    assert wait.called(("lookup",), 0.0, 10.0) == GRACE_S  # never called: a moment to answer first
    wait.answered(3.0)
    assert wait.expected_s == {"lookup": 3.0} and not wait.waiting
    assert wait.called(("lookup",), 10.0, 12.0) == 0.0  # three seconds expected, two to spare: at once
    wait.answered(11.0)
    assert wait.expected_s["lookup"] == 2.0  # smoothed: half the old, half the new
    assert wait.called(("lookup",), 20.0, 30.0) == 9.5  # two expected, ten to spare: only if it runs late


async def test_a_slow_function_gets_a_filler_then_the_answer_and_the_next_call_its_filler_at_once():
    engine = FakeEngine(FakeTokenizer(), {QUESTION: tools.call_text("lookup", "{}")}, asr=FakeASR(""),
                        tts=FakeTTS())
    runtime = Runtime(engine, engine.tokenizer, "fake-model", 16000, 16000)
    client = QueueTransport()
    session = Session(native(client), runtime, Limits())
    served = asyncio.create_task(session.run())
    stage = next(s for s in session.pipeline.stages if isinstance(s, LLMStage))
    try:
        await client.until(ServerEvent.SESSION_CREATED)
        client.put({"type": ClientEvent.SESSION_UPDATE, "session": {"tools": [LOOKUP]}}, *ASK)
        called = await client.until(ServerEvent.RESPONSE_DONE)
        call = next(o for o in called["response"]["output"] if o["type"] == "function_call")
        called_at = time.monotonic()
        asked = len(engine.requests)
        filler = (await client.until(ServerEvent.RESPONSE_DONE, 2))["response"]
        assert time.monotonic() - called_at < 1.0
        assert filler["output"][0]["text"] in CallConfig().fillers  # a set phrase, spoken
        assert len(engine.requests) == asked  # no model step
        await asyncio.sleep(1.5 - (time.monotonic() - called_at))  # the function takes its time
        client.put({"type": ClientEvent.ITEM_CREATE, "item": {"type": "function_call_output",
                                                              "call_id": call["call_id"], "output": "at 9:40"}},
                   {"type": ClientEvent.RESPONSE_CREATE})
        answer = (await client.until(ServerEvent.RESPONSE_DONE, 3))["response"]
        assert answer["status"] == "completed" and "9:40" in answer["output"][0]["text"]
        assert not client.events(ServerEvent.ERROR)
        assert 1.4 < stage.tool_wait.expected_s["lookup"] < 2.5
        client.put(*ASK)
        await client.until(ServerEvent.RESPONSE_DONE, 4)
        again = time.monotonic()
        await client.until(ServerEvent.RESPONSE_DONE, 5)  # learnt to be slow: its filler at once
        assert time.monotonic() - again < 0.5
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)
    # Another call of the server: the function's time is known, and its filler's audio was kept.
    client = QueueTransport()
    served = asyncio.create_task(Session(native(client), runtime, Limits()).run())
    try:
        await client.until(ServerEvent.SESSION_CREATED)
        client.put({"type": ClientEvent.SESSION_UPDATE, "session": {"tools": [LOOKUP]}}, *ASK)
        await client.until(ServerEvent.RESPONSE_DONE)
        called_at, synthesized = time.monotonic(), len(engine.jobs)
        filler = (await client.until(ServerEvent.RESPONSE_DONE, 2))["response"]
        assert time.monotonic() - called_at < GRACE_S  # at once, not after a never-called function's grace
        assert filler["output"][0]["text"] == CallConfig().fillers[0] and len(engine.jobs) == synthesized
        assert any(isinstance(m, bytes) for m in client.sent)  # heard all the same
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)


def test_the_times_kept_are_bounded_and_the_oldest_function_goes_first(monkeypatch):
    from voicepipe.pipeline import tool_wait

    monkeypatch.setattr(tool_wait, "MAX_KEPT", 2)
    wait = ToolWait()
    for n, name in enumerate(("a", "b", "c")):
        wait.called((name,), float(n), 10.0)
        wait.answered(n + 0.5)
    assert list(wait.expected_s) == ["b", "c"]
