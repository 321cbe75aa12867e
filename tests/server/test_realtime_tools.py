"""Function calling in calls, over the fake engine (milliseconds): the session's tools reach the model's
prompt and grammar; a call comes back as a function_call item with streamed arguments and is never spoken;
its output, sent as a function_call_output item, and a response.create continue the turn with a spoken
answer, timed from the caller's speech. Both Realtime dialects, through the `openai` SDK's own clients."""

import asyncio
import json
import time

import numpy as np
import openai
import pytest
import pytest_asyncio
from support.fake_call import QUESTION, SECOND, Call, fake_server, read_until

from voicepipe.call.limits import Limits
from voicepipe.constrained import tools
from voicepipe.pipeline.events import SpeechAudio, SpeechStarted, SpeechStopped
from voicepipe.pipeline.requests import ItemCreated, ResponseRequested

pytestmark = pytest.mark.asyncio(loop_scope="module")
ARGUMENTS = '{"a": 37, "b": 43}'
CALL = tools.call_text("multiply", ARGUMENTS)
MULTIPLY = {"type": "function", "name": "multiply", "description": "The product of a and b.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["a", "b"], "additionalProperties": False}}


@pytest_asyncio.fixture(loop_scope="module")
async def served():
    async with fake_server(Limits(), reply=CALL) as served:
        yield served


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_a_function_call_round_trip_through_the_openai_sdk(served, beta):
    server, engine = served
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
    realtime = client.beta.realtime if beta else client.realtime
    async with realtime.connect(model="voicepipe") as connection:
        session = {"tools": [MULTIPLY], "tool_choice": "auto"}
        await connection.session.update(session=session if beta else {"type": "realtime", **session})
        assert (await read_until(connection, "session.updated", [])).session.tools[0].name == "multiply"
        await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is 37 times 43?"}]})
        await connection.response.create()
        seen: list = []
        done = await read_until(connection, "response.done", seen)
        kinds = [e.type for e in seen]
        deltas = "".join(e.delta for e in seen if e.type == "response.function_call_arguments.delta")
        assert deltas == ARGUMENTS and kinds.index("response.function_call_arguments.done") < kinds.index(
            "response.done")
        call = next(item for item in done.response.output if item.type == "function_call")
        assert (call.name, json.loads(call.arguments)) == ("multiply", {"a": 37, "b": 43})
        spoken = [e for e in seen if "audio" in e.type and "delta" in e.type]
        assert not spoken  # a call is not spoken
        request = engine.requests[-1]
        assert request.params.grammar.kind == "structural_tag"
        assert any('"name": "multiply"' in engine.tokenizer.strings[i] for i in request.prompt)
        await connection.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                        "output": "1591"})
        await connection.response.create()
        seen = []
        await read_until(connection, "response.done", seen)
        transcript = "".join(e.delta for e in seen if e.type.endswith("audio_transcript.delta"))
        assert transcript == "The answer is 1591." and any(e.type.endswith("audio.delta") for e in seen)
        said = [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]
        assert f"assistant: {CALL}" in said and "tool: 1591" in said


async def test_tools_that_are_not_functions_or_have_bad_schemas_are_refused(served):
    server, _ = served
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused")
    async with client.realtime.connect(model="voicepipe") as connection:
        for bad in ([{"type": "mcp", "server_label": "x"}],
                    [{**MULTIPLY, "parameters": {"type": "nonsense"}}]):
            await connection.session.update(session={"type": "realtime", "tools": bad})
            error = await read_until(connection, "error", [])
            assert error.error.code in ("invalid_session_update", "invalid_grammar")
            assert error.error.param.startswith("session.tools[0]") and "tools[0]" in error.error.message


async def test_in_a_call_a_tool_call_is_silent_and_the_answer_after_it_counts_from_the_callers_speech():
    call = Call(reply=CALL, tools=tuple(tools.parse_tools([MULTIPLY], nested=False)), tool_choice="required")
    call.conversation.tool_instructions = tools.instructions(list(call.config.tools), "required")
    spoke = time.monotonic()
    await call.push(SpeechStarted("item_1", 0, spoke), SpeechAudio("item_1", np.zeros(SECOND, np.float32), False),
                    SpeechStopped("item_1", 1000, spoke, SECOND))
    while "response.done" not in call.client.kinds():
        await asyncio.sleep(0.01)
    assert not [m for m in call.client.messages if isinstance(m, bytes)]  # nothing spoken
    (done,) = call.client.of("response.function_call_arguments.done")
    assert done["arguments"] == ARGUMENTS and call.engine.requests[-1].params.grammar is not None
    await asyncio.sleep(0.3)  # the client runs the function
    asked = time.monotonic()
    await call.push(ItemCreated("item_out", "tool", "1591"), ResponseRequested())
    while len(call.client.of("response.done")) < 2:
        await asyncio.sleep(0.01)
    answer = call.client.of("response.done")[-1]["response"]
    assert answer["output"][0]["text"] == "The answer is 1591."
    assert [m for m in call.client.messages if isinstance(m, bytes)]  # the answer is spoken
    assert answer["timings"]["first_audio_s"] >= asked - spoke  # from the caller's speech, not the request
    await call.close()


async def test_an_out_of_band_reply_may_call_but_its_call_stays_out_of_the_conversation():
    call = Call(reply=CALL, tools=tuple(tools.parse_tools([MULTIPLY], nested=False)), tool_choice="required")
    await call.push(ItemCreated("item_q", "user", QUESTION), ResponseRequested(out_of_band=True))
    while "response.done" not in call.client.kinds():
        await asyncio.sleep(0.01)
    assert call.client.of("response.function_call_arguments.done")  # it called
    assert [i["role"] for i in call.conversation.items] == ["user"]  # and the conversation did not change
    await call.close()
