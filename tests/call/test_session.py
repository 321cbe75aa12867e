"""A Session and the Realtime dialect driven through an in-memory transport and the fake engine: bad input
answered and the call going on, a client that vanishes, an idle one, in milliseconds."""

import asyncio
import base64
import json
from contextlib import asynccontextmanager

from support.fake_transport import QueueTransport, native
from support.fake_transport import realtime as realtime_line
from support.fakes import FakeASR, FakeEngine, FakeTokenizer, FakeTTS

from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.protocol import ClientEvent, ServerEvent

QUESTION, REPLY = "What is the capital of France?", "Paris is the capital of France."
TEXT_ITEM = {"type": ClientEvent.ITEM_CREATE,
             "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}}


@asynccontextmanager
async def session(limits: Limits | None = None, realtime: bool = False):
    """A call being served over a QueueTransport: (client transport, session, engine)."""
    engine = FakeEngine(FakeTokenizer(), {QUESTION: REPLY}, asr=FakeASR(""), tts=FakeTTS())
    runtime = Runtime(engine, engine.tokenizer, "fake-model", 16000, 16000)
    limits = limits or Limits()
    client = QueueTransport()
    line = realtime_line(client, runtime, limits) if realtime else native(client, limits)
    call = Session(line, runtime, limits)
    served = asyncio.create_task(call.run())
    try:
        await client.until("session.created")
        yield client, call, engine
    finally:
        client.leave()
        await asyncio.wait_for(served, 5)


async def test_malformed_oversized_and_unknown_messages_get_errors_and_the_call_goes_on():
    async with session(Limits(max_message_bytes=2048)) as (client, call, _):
        client.put("{not json", json.dumps({"type": "x", "pad": "a" * 4096}), {"type": "no.such.event"},
                   {"type": 7, "event_id": "evt_1"}, "[1, 2]")
        await client.until(ServerEvent.ERROR, 5)
        codes = [e["error"]["code"] for e in client.events(ServerEvent.ERROR)]
        assert codes[:2] == ["invalid_json", "message_too_large"] and len(codes) == 5
        assert client.events(ServerEvent.ERROR)[3]["error"]["event_id"] == "evt_1"
        client.put(TEXT_ITEM, {"type": ClientEvent.RESPONSE_CREATE})
        done = await client.until(ServerEvent.RESPONSE_DONE)
        assert done["response"]["status"] == "completed" and not call.replying  # what a draining server waits on


async def test_a_client_that_vanishes_mid_reply_ends_its_call_and_its_request():
    async with session() as (client, call, engine):
        engine.gate.clear()  # the reply is being written when the client goes
        client.put(TEXT_ITEM, {"type": ClientEvent.RESPONSE_CREATE})
        await client.until(ServerEvent.RESPONSE_CREATED)
        assert call.id in engine.sessions and call.replying
        client.leave()
        for _ in range(100):
            if call.id not in engine.sessions:
                break
            await asyncio.sleep(0.01)
        assert call.id not in engine.sessions  # released from the KV pool
        assert all(r.closed for r in engine.requests)  # the reply's request was aborted
        assert not call.pipeline.tasks  # every task of the call ended


async def test_an_idle_client_is_told_and_closed():
    async with session(Limits(idle_timeout_s=0.05)) as (client, _, _):
        error = await client.until(ServerEvent.ERROR)
        assert error["error"]["code"] == "idle_timeout" and client.closed == (1000, "idle timeout")


async def test_the_realtime_dialect_refuses_bad_audio_and_binary_frames():
    async with session(realtime=True) as (client, _, _):
        client.put(b"\x00\x01", {"type": ClientEvent.AUDIO_APPEND, "audio": "not base64!", "event_id": "evt_a"},
                   {"type": ClientEvent.AUDIO_APPEND, "audio": base64.b64encode(b"\x00\x01\x02").decode()})
        await client.until(ServerEvent.ERROR, 3)
        errors = [(e["error"]["code"], e["error"]["event_id"]) for e in client.events(ServerEvent.ERROR)]
        assert errors == [("invalid_event", None), ("invalid_audio", "evt_a"), ("invalid_audio", None)]
        client.put({"type": ClientEvent.AUDIO_APPEND, "audio": base64.b64encode(bytes(4800)).decode()})
        client.put(TEXT_ITEM, {"type": ClientEvent.RESPONSE_CREATE})
        assert (await client.until("response.done"))["response"]["status"] == "completed"  # the call went on


MULTIPLY = {"type": "function", "name": "multiply", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}
CLOCK = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


async def test_a_responses_own_tools_hold_for_that_reply_and_the_sessions_come_back_after():
    async with session() as (client, _, engine):
        def asked() -> tuple[str, str | None]:
            request = engine.requests[-1]
            system = next(engine.tokenizer.strings[i] for i in request.prompt
                          if engine.tokenizer.strings[i].startswith("system:"))
            return system, request.params.grammar and request.params.grammar.kind

        client.put({"type": ClientEvent.SESSION_UPDATE, "session": {"tools": [MULTIPLY], "tool_choice": "auto"}},
                   TEXT_ITEM, {"type": ClientEvent.RESPONSE_CREATE,
                               "response": {"tools": [CLOCK], "tool_choice": "required"}})
        await client.until(ServerEvent.RESPONSE_DONE)
        system, grammar = asked()
        assert '"name": "get_time"' in system and "multiply" not in system and "You must call one" in system
        assert grammar == "structural_tag"
        client.put({"type": ClientEvent.RESPONSE_CREATE})
        await client.until(ServerEvent.RESPONSE_DONE, 2)
        system, grammar = asked()
        assert '"name": "multiply"' in system and "get_time" not in system and grammar == "structural_tag"
        client.put({"type": ClientEvent.RESPONSE_CREATE, "response": {"tool_choice": "none"}})
        await client.until(ServerEvent.RESPONSE_DONE, 3)
        system, grammar = asked()
        assert "multiply" not in system and grammar == "regex"  # no call this time: plain words, none described
        client.put({"type": ClientEvent.RESPONSE_CREATE, "response": {"tools": [{"type": "function"}]}})
        error = await client.until(ServerEvent.ERROR)
        assert error["error"]["code"] == "invalid_response" and error["error"]["param"] == "response.tools[0].name"
        session_tools = (await client.until(ServerEvent.SESSION_UPDATED))["session"]["tools"]
        assert [t["name"] for t in session_tools] == ["multiply"]  # the session's own, untouched


async def test_a_reply_given_its_own_input_reads_only_that_and_an_item_it_names():
    async with session() as (client, _, engine):
        said = lambda: [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]  # noqa: E731
        client.put({**TEXT_ITEM, "item": {**TEXT_ITEM["item"], "id": "item_q"}},
                   {"type": ClientEvent.ITEM_CREATE, "item": {"type": "message", "role": "user", "content": [
                       {"type": "input_text", "text": "Something else entirely."}]}},
                   {"type": ClientEvent.RESPONSE_CREATE, "response": {"conversation": "none", "input": [
                       {"type": "item_reference", "id": "item_q"},
                       {"type": "message", "role": "user", "content": [
                           {"type": "input_text", "text": "Classify that question in one word."}]}]}})
        await client.until(ServerEvent.RESPONSE_DONE)
        prompt = said()
        assert f"user: {QUESTION}" in prompt and "user: Classify that question in one word." in prompt
        assert "user: Something else entirely." not in prompt  # the rest of the conversation is not read
        assert engine.requests[-1].session is None  # no prefix of the call's to extend
        client.put({"type": ClientEvent.RESPONSE_CREATE, "response": {"input": [
            {"type": "item_reference", "id": "item_gone"}]}})
        assert (await client.until(ServerEvent.ERROR))["error"]["code"] == "item_not_found"
        client.put({"type": ClientEvent.RESPONSE_CREATE, "response": {"input": "not a list"}})
        error = await client.until(ServerEvent.ERROR, 2)
        assert error["error"]["code"] == "invalid_response" and error["error"]["param"] == "response.input"


async def test_a_key_press_is_told_back_and_a_key_the_keypad_has_not_is_refused():
    async with session() as (client, _, _):
        client.put({"type": ClientEvent.KEY_PRESSED, "digit": "5"}, {"type": ClientEvent.KEY_PRESSED, "digit": "55"})
        received = await client.until(ServerEvent.KEY_RECEIVED)
        assert received["event"] == "5" and isinstance(received["received_at"], int)
        assert (await client.until(ServerEvent.ERROR))["error"]["param"] == "digit"


async def test_a_call_told_to_record_its_front_end_writes_what_it_was_given_when_it_ends(tmp_path):
    """`serve --record-front-end`: the microphone as the front end got it, beside its far end, for a replay."""
    import numpy as np

    from voicepipe.frontend.recording import load
    from voicepipe.pipeline import CallConfig

    engine = FakeEngine(FakeTokenizer(), {QUESTION: REPLY}, asr=FakeASR(""), tts=FakeTTS())
    runtime = Runtime(engine, engine.tokenizer, "fake-model", 16000, 16000)
    client = QueueTransport()
    folder = tmp_path / "calls"
    call = Session(native(client, Limits()), runtime, Limits(), CallConfig(record_front_end=str(folder)))
    served = asyncio.create_task(call.run())
    await client.until("session.created")
    sent = (np.sin(np.arange(8000) / 7) * 3000).astype("<i2")
    client.put(sent[:4000].tobytes(), sent[4000:].tobytes())
    for _ in range(100):
        if call.front.recording is not None and call.front.recording.samples >= len(sent):
            break
        await asyncio.sleep(0.01)
    client.leave()
    await asyncio.wait_for(served, 5)
    for _ in range(100):  # written on a thread of its own, the call's slot already free
        if (folder / f"{call.id}.npz").exists():
            break
        await asyncio.sleep(0.02)
    near, far, restarts, settings = load(folder / f"{call.id}.npz")
    assert np.allclose(near, sent / 32768.0, atol=1e-4) and len(far) == len(sent) and not far.any()
    assert (restarts, settings) == ([], [(0, True, "near_field")])
