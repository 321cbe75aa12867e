"""The Realtime dialect's own rules on a real server over the fake engine, in milliseconds: errors that name
the client event behind them, and conversation items read, deleted and kept in order."""

import asyncio
import json

import pytest
import pytest_asyncio
from support.fake_call import fake_server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from voicepipe.call.limits import Limits

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def served():
    async with fake_server(Limits()) as served:
        yield served


class Realtime:
    """A raw Realtime client: send events, read until one of a kind."""

    def __init__(self, ws) -> None:
        self.ws = ws

    async def send(self, event: dict) -> None:
        await self.ws.send(json.dumps(event))

    async def until(self, kind: str) -> dict:
        while True:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
            if message["type"] == kind:
                return message

    async def error_for(self, event: dict) -> dict:
        await self.send(event)
        return (await self.until("error"))["error"]


def text(role: str, words: str) -> dict:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": role, "content": [
        {"type": "input_text" if role == "user" else "output_text", "text": words}]}}


async def test_every_error_names_the_realtime_event_that_caused_it(served):
    server, engine = served
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        error_for = Realtime(ws).error_for
        await error_for({"type": "session.update", "session": {"instructions": 5}, "event_id": "evt_warmup"})
        assert (await error_for({"type": "no.such.event", "event_id": "evt_1"}))["event_id"] == "evt_1"
        error = await error_for({"type": "input_audio_buffer.commit", "event_id": "evt_2"})
        assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "evt_2")  # from the pipeline
        error = await error_for({"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "evt_3"})
        assert (error["code"], error["event_id"]) == ("invalid_audio", "evt_3")  # from the dialect
        await ws.send(json.dumps(text("user", "Hello?")))
        engine.gate.clear()  # the first reply stays in progress
        await ws.send(json.dumps({"type": "response.create", "event_id": "evt_4"}))
        error = await error_for({"type": "response.create", "event_id": "evt_5"})
        assert (error["code"], error["event_id"]) == ("conversation_already_has_active_response", "evt_5")
        assert (await error_for({"type": "response.create"}))["event_id"] is None  # no id given, none back
        engine.gate.set()


async def test_items_are_read_deleted_and_kept_in_order(served):
    server, engine = served
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        call = Realtime(ws)
        ids = []
        for role, words in (("user", "Remember the word banana."), ("assistant", "I will."), ("user", "Hello?")):
            await call.send(text(role, words))
            ids.append((await call.until("conversation.item.added"))["item"]["id"])
        await call.send({"type": "conversation.item.retrieve", "item_id": ids[0]})
        item = (await call.until("conversation.item.retrieved"))["item"]
        assert item["id"] == ids[0] and item["content"][0]["text"] == "Remember the word banana."
        await call.send({"type": "conversation.item.delete", "item_id": ids[2], "event_id": "evt_d"})
        assert (await call.until("conversation.item.deleted"))["item_id"] == ids[2]
        await call.send({"type": "conversation.item.delete", "item_id": ids[0]})
        await call.until("conversation.item.deleted")
        await call.send(text("user", "What was the word?"))
        added = await call.until("conversation.item.added")
        assert added["previous_item_id"] == ids[1]  # what is left: the assistant's item, then this one
        await call.send({"type": "response.create"})
        await call.until("response.done")
        said = [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]
        assert "user: What was the word?" in said and not any("banana" in s or "Hello" in s for s in said)
        error = await call.error_for({"type": "conversation.item.retrieve", "item_id": ids[0], "event_id": "evt_r"})
        assert (error["code"], error["event_id"]) == ("item_not_found", "evt_r")


async def reply_events(ws_url: str, response: dict, beta: bool = False) -> list[dict]:
    """Every event of one reply to "Hello?", asked for with `response.create` of `response`."""
    headers = {"OpenAI-Beta": "realtime=v1"} if beta else {}
    async with connect(ws_url, additional_headers=headers) as ws:
        call = Realtime(ws)
        await call.send(text("user", "Hello?"))
        await call.until("conversation.item.created" if beta else "conversation.item.added")
        await call.send({"type": "response.create", "response": response})
        seen = []
        while not seen or seen[-1]["type"] != "response.done":
            seen.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        return seen


async def test_a_text_only_reply_sends_text_and_no_audio_in_each_dialects_names(served):
    server, engine = served
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    ga = await reply_events(url, {"output_modalities": ["text"]})
    kinds = [e["type"] for e in ga]
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    assert not any("audio" in kind for kind in kinds), kinds
    part = next(e for e in ga if e["type"] == "response.content_part.done")["part"]
    assert part == {"type": "text", "text": "one two three four five six"}  # a part says text, its item output_text
    assert ga[-1]["response"]["output"][0]["content"][0]["type"] == "output_text"
    assert ga[-1]["response"]["output_modalities"] == ["text"]
    beta = await reply_events(url, {"modalities": ["text"]}, beta=True)
    kinds = [e["type"] for e in beta]
    assert "response.text.delta" in kinds and "response.output_text.delta" not in kinds
    assert next(e for e in beta if e["type"] == "response.content_part.added")["part"]["type"] == "text"
    spoken = await reply_events(url, {}, beta=True)  # a spoken reply's part, as the beta names it
    assert next(e for e in spoken if e["type"] == "response.content_part.added")["part"]["type"] == "audio"


async def test_a_reply_outside_the_conversation_with_its_own_instructions_and_length(served):
    server, engine = served
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    seen = await reply_events(url, {"conversation": "none", "instructions": "Answer in French.",
                                    "max_output_tokens": 2, "metadata": {"topic": "greeting"}})
    request = engine.requests[-1]
    assert request.params.max_tokens == 2 and request.session is None
    assert "system: Answer in French." in [engine.tokenizer.strings[i] for i in request.prompt]
    assert not [e for e in seen if e["type"] in ("conversation.item.added", "conversation.item.done")
                and e["item"]["role"] == "assistant"]  # out of band: not in the conversation
    assert seen[-1]["response"]["output"][0]["content"][0]["transcript"] == "one two"
    async with connect(url) as ws:
        call = Realtime(ws)
        for bad, field in (({"max_output_tokens": 0}, "max_output_tokens"), ({"conversation": "x"}, "conversation"),
                           ({"output_modalities": ["video"]}, "output_modalities")):
            error = await call.error_for({"type": "response.create", "response": bad, "event_id": "evt_b"})
            assert error["code"] == "invalid_response" and field in error["message"] and error["event_id"] == "evt_b"


async def test_a_text_only_session_answers_in_text_until_a_reply_asks_for_audio(served):
    server, engine = served
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        call = Realtime(ws)
        await call.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        assert (await call.until("session.updated"))["session"]["output_modalities"] == ["text"]
        await call.send(text("user", "Hello?"))
        await call.send({"type": "response.create"})
        kinds = []
        while not kinds or kinds[-1] != "response.done":
            kinds.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
        assert "response.output_text.delta" in kinds and not any("audio" in k for k in kinds), kinds
        await call.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
        await call.until("response.output_audio_transcript.delta")  # this one reply is spoken
        await call.until("response.done")


@pytest.mark.parametrize("path", ["/ws", "/v1/realtime"])
async def test_a_call_beyond_the_limit_is_refused_with_an_error_it_can_read(path):
    async with fake_server(Limits(max_calls=1)) as (server, _):
        async with connect(f"ws://127.0.0.1:{server.port}{path}") as first:
            await first.recv()  # session.created: the one call the server takes
            async with connect(f"ws://127.0.0.1:{server.port}{path}") as second:
                refused = json.loads(await asyncio.wait_for(second.recv(), 10))
                assert refused["type"] == "error" and refused["error"]["code"] == "too_many_calls"
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(second.recv(), 10)
                assert second.close_code == 1013


async def test_an_oversized_realtime_event_is_refused_before_it_is_parsed_and_the_call_goes_on():
    async with fake_server(Limits(max_message_bytes=1000)) as (server, _):
        async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
            call = Realtime(ws)
            await call.until("session.created")
            error = await call.error_for({"type": "conversation.item.create", "item": "x" * 2000})
            assert error["code"] == "message_too_large" and "over the limit of 1000" in error["message"]
            await call.send(text("user", "Still there?"))
            assert (await call.until("conversation.item.added"))["item"]["content"][0]["text"] == "Still there?"


async def test_truncation_sets_how_much_of_the_prompt_a_cut_keeps_and_disabled_is_refused(served):
    server, _ = served
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        call = Realtime(ws)
        await call.send({"type": "session.update", "session": {
            "type": "realtime", "truncation": {"type": "retention_ratio", "retention_ratio": 0.7}}})
        assert (await call.until("session.updated"))["session"]["truncation"] == {
            "type": "retention_ratio", "retention_ratio": 0.7}
        for bad in ("disabled", {"type": "retention_ratio", "retention_ratio": 0}, {"type": "retention_ratio"}):
            error = await call.error_for({"type": "session.update", "session": {"type": "realtime", "truncation": bad}})
            assert (error["code"], error["param"]) == ("invalid_session_update", "truncation")
        await call.send({"type": "session.update", "session": {"type": "realtime", "truncation": "auto"}})
        assert (await call.until("session.updated"))["session"]["truncation"] == "auto"


async def test_a_reply_asked_right_after_a_session_update_has_the_updated_modality(served):
    server, engine = served
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        call = Realtime(ws)
        await call.send(text("user", "Hello?"))
        await call.until("conversation.item.added")
        # no wait for session.updated: the reply is the updated session's
        await call.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await call.send({"type": "response.create"})
        done = await call.until("response.done")
        assert done["response"]["output_modalities"] == ["text"]
        assert done["response"]["output"][0]["content"][0]["type"] == "output_text"
