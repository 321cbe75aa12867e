"""Every event and body the server sends, checked against the `openai` package's own pydantic types: each
Realtime server event of both dialects (GA and the beta) over a scenario that exercises them, and chat
completions whole and streamed. A field the types do not know is a failure unless it is one of this
server's documented extensions. A real server over the fake engine; real VAD, so the speech events happen."""

import asyncio
import base64
import json
import wave
from importlib import resources

import numpy as np
import pytest
import pytest_asyncio
import soxr
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from support.fake_call import fake_server, http
from support.realtime_types import BETA_EVENTS, GA_EVENTS, unknown_fields, violations
from websockets.asyncio.client import connect

from voicepipe.call.limits import Limits
from voicepipe.constrained import tools

pytestmark = pytest.mark.asyncio(loop_scope="module")
QUESTION = "What is the capital of France?"
CALL = tools.call_text("multiply", '{"a": 37, "b": 43}')
MULTIPLY = {"type": "function", "name": "multiply", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}
SEEN_AT_LEAST = {"session.created", "session.updated", "input_audio_buffer.speech_started",
                 "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                 "conversation.item.input_audio_transcription.completed", "response.created",
                 "response.output_item.added", "response.content_part.added", "response.content_part.done",
                 "response.output_item.done", "response.done", "conversation.item.retrieved",
                 "conversation.item.deleted", "conversation.item.truncated", "input_audio_buffer.cleared",
                 "response.function_call_arguments.delta", "response.function_call_arguments.done", "error"}


def speech_24k() -> np.ndarray:
    """The packaged spoken question at the Realtime rate, then a second of silence to end the turn."""
    with resources.as_file(resources.files("voicepipe.samples") / "question.wav") as path, wave.open(str(path)) as w:
        rate, pcm = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), "<i2")
    return np.concatenate([soxr.resample(pcm, rate, 24000).astype("<i2"), np.zeros(24000, "<i2")])


@pytest_asyncio.fixture(loop_scope="module")
async def served():
    async with fake_server(Limits(), heard=QUESTION, replies={"Multiply 37 by 43.": CALL}) as served:
        yield served


class Recorder:
    """A raw Realtime client that keeps every event the server sends."""

    def __init__(self, ws) -> None:
        self.ws, self.events = ws, []

    async def send(self, event: dict) -> None:
        await self.ws.send(json.dumps(event))

    async def until(self, kind: str) -> dict:
        while True:
            event = json.loads(await asyncio.wait_for(self.ws.recv(), 20))
            self.events.append(event)
            if event["type"] == kind:
                return event


async def scenario(call: Recorder, engine, beta: bool) -> None:
    """A spoken turn, a text one answered in text, an out-of-band reply, a cancelled reply, the
    conversation read, truncated and edited, a function call and its output answered; then two errors."""
    added = "conversation.item.created" if beta else "conversation.item.added"
    await call.until("session.created")
    vad = {"type": "server_vad", "silence_duration_ms": 500}
    await call.send({"type": "session.update", "session": {"instructions": "Be brief.", "turn_detection": vad}
                     if beta else {"type": "realtime", "instructions": "Be brief.",
                                   "audio": {"input": {"turn_detection": vad}}}})
    await call.until("session.updated")
    pcm = speech_24k()
    for start in range(0, len(pcm), 2400):
        await call.send({"type": "input_audio_buffer.append",
                         "audio": base64.b64encode(pcm[start:start + 2400].tobytes()).decode()})
    spoken = (await call.until("response.done"))["response"]["output"][0]["id"]
    await call.send({"type": "conversation.item.truncate", "item_id": spoken, "content_index": 0,
                     "audio_end_ms": 100})
    await call.until("conversation.item.truncated")
    await call.send({"type": "conversation.item.retrieve", "item_id": spoken})
    assert (await call.until("conversation.item.retrieved"))["item"]["content"][0]["transcript"]  # spoken: audio
    await call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "assistant",
                     "content": [{"type": "text" if beta else "output_text", "text": "Noted."}]}})
    await call.until(added)
    await call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Hello?"}]}})
    typed = (await call.until(added))["item"]["id"]
    await call.send({"type": "response.create", "response": {
        "metadata": {"client_event_id": "c1"}, ("modalities" if beta else "output_modalities"): ["text"]}})
    await call.until("response.done")
    await call.send({"type": "response.create", "response": {"conversation": "none"}})
    await call.until("response.done")
    engine.gate.clear()
    await call.send({"type": "response.create"})
    await call.until("response.created")
    await call.send({"type": "response.cancel"})
    engine.gate.set()
    await call.until("response.done")
    await call.send({"type": "conversation.item.retrieve", "item_id": typed})
    await call.until("conversation.item.retrieved")
    await call.send({"type": "conversation.item.delete", "item_id": typed})
    await call.until("conversation.item.deleted")
    await call.send({"type": "input_audio_buffer.clear"})
    await call.until("input_audio_buffer.cleared")
    await call.send({"type": "session.update", "session": {"tools": [MULTIPLY]} if beta else {
        "type": "realtime", "tools": [MULTIPLY], "tool_choice": "auto"}})
    await call.until("session.updated")
    await call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Multiply 37 by 43."}]}})
    await call.until(added)
    await call.send({"type": "response.create"})
    done = await call.until("response.done")
    call_id = next(item["call_id"] for item in done["response"]["output"] if item["type"] == "function_call")
    await call.send({"type": "conversation.item.create", "item": {"type": "function_call_output",
                                                                  "call_id": call_id, "output": "1591"}})
    await call.until(added)
    await call.send({"type": "response.create"})
    await call.until("response.done")
    await call.send({"type": "no.such.event", "event_id": "evt_1"})
    await call.until("error")
    await call.send({"type": "input_audio_buffer.append", "audio": "%%%"})
    await call.until("error")


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_every_realtime_server_event_matches_the_openai_types(served, beta):
    server, engine = served
    headers = {"OpenAI-Beta": "realtime=v1"} if beta else {}
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime", additional_headers=headers) as ws:
        call = Recorder(ws)
        await scenario(call, engine, beta)
    kinds = {e["type"] for e in call.events}
    names = {"response.output_audio.delta": "response.audio.delta",
             "conversation.item.added": "conversation.item.created"} if beta else {}
    expected = SEEN_AT_LEAST | {names.get(k, k) for k in ("response.output_audio.delta", "conversation.item.added")}
    assert expected <= kinds, f"the scenario missed {sorted(expected - kinds)}"
    wrong = [v for event in call.events for v in violations(event, BETA_EVENTS if beta else GA_EVENTS)]
    assert not wrong, "\n".join(wrong)


async def test_a_foreign_name_or_an_unknown_field_is_a_violation():
    """The check itself: a GA name on the beta, a part type neither allows, a field no type declares."""
    part = {"event_id": "e", "type": "response.content_part.added", "response_id": "r", "item_id": "i",
            "output_index": 0, "content_index": 0, "part": {"type": "audio", "transcript": ""}}
    assert violations(part, GA_EVENTS) == [] and violations(part, BETA_EVENTS) == []
    assert violations({**part, "part": {"type": "output_audio"}}, GA_EVENTS)
    assert violations({**part, "type": "conversation.item.done", "item": {}}, BETA_EVENTS)
    assert violations({**part, "surprise": 1}, GA_EVENTS) == ["response.content_part.added: surprise"]


async def test_chat_completions_whole_and_streamed_match_the_openai_types(served):
    server, _ = served
    request = {"model": "fake-model", "messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 4}
    whole = ChatCompletion.model_validate(json.loads(await http(server, request)))
    assert unknown_fields(whole) == [] and whole.choices[0].message.content
    stream = await http(server, {**request, "stream": True, "stream_options": {"include_usage": True}})
    lines = [line[6:] for line in stream.decode().splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(line)) for line in lines[:-1]]
    assert all(unknown_fields(chunk) == [] for chunk in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
