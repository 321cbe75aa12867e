"""The Realtime dialect's own rules on a real server over the fake engine, in milliseconds: errors that name
the client event behind them, and conversation items read, deleted and kept in order."""

import asyncio
import json

import pytest
import pytest_asyncio
from fake_call import fake_server
from websockets.asyncio.client import connect

from voicepipe.limits import Limits

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
