"""Function calling and structured outputs in the text API, over the fake engine (milliseconds): the request
the engine gets (its grammar, the tools in its prompt, the history's calls), the answer's `tool_calls`
(or `function_call`, asked the deprecated way) whole and as stream deltas (checked against the openai
package's own types), and bad schemas refused by the field at fault. The call format's parser on its own
too, fed in every possible split."""

import json

import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from support.fake_call import fake_server, http

from voicepipe.call.limits import Limits
from voicepipe.constrained import tools

pytestmark = pytest.mark.asyncio(loop_scope="module")
MULTIPLY = {"type": "function", "function": {"name": "multiply", "description": "The product of a and b.",
                                             "parameters": {"type": "object", "properties": {
                                                 "a": {"type": "integer"}, "b": {"type": "integer"}},
                                                 "required": ["a", "b"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = tools.call_text("multiply", '{"a": 37, "b": 43}')


@pytest_asyncio.fixture(loop_scope="module")
async def served():
    async with fake_server(Limits(), reply=CALL) as served:
        yield served


def chat(**extra) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "What is 37 times 43?"}], **extra}


async def post(server, body: dict) -> tuple[int, dict]:
    from support.fake_call import post as raw

    status, _, answer = await raw(server, body)
    return status, answer


async def test_a_required_call_comes_back_as_tool_calls_with_its_arguments(served):
    server, engine = served
    status, body = await post(server, chat(tools=[MULTIPLY, CLOCK], tool_choice="required"))
    assert status == 200, body
    answer = ChatCompletion.model_validate(body)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "multiply" and json.loads(call.function.arguments) == {"a": 37, "b": 43}
    request = engine.requests[-1]
    assert request.params.grammar.kind == "structural_tag"
    prompt = engine.tokenizer.strings
    system = next(prompt[i] for i in request.prompt if prompt[i].startswith("system:"))
    assert '"name": "multiply"' in system and "You must call one of them." in system


async def test_streamed_tool_call_deltas_reassemble_to_the_final_arguments(served):
    server, _ = served
    payload = await http(server, chat(tools=[MULTIPLY], tool_choice={"type": "function",
                                                                   "function": {"name": "multiply"}}, stream=True))
    lines = [line[6:] for line in payload.decode().splitlines() if line.startswith("data: ")]
    chunks = [ChatCompletionChunk.model_validate(json.loads(line)) for line in lines[:-1]]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "multiply" and deltas[0].type == "function"
    assert all(d.index == 0 for d in deltas) and len(deltas) > 2  # the arguments came in pieces
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"a": 37, "b": 43}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)  # no call text leaked as content


async def test_the_history_carries_calls_and_their_results_in_the_call_format(served):
    server, engine = served
    history = [{"role": "user", "content": "What is 37 times 43?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "multiply", "arguments": '{"a": 37, "b": 43}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "1591"}]
    status, _ = await post(server, {"model": "fake-model", "messages": history, "tools": [MULTIPLY]})
    assert status == 200
    said = [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]
    assert f"assistant: {CALL}" in said and "tool: 1591" in said


async def test_the_deprecated_functions_are_read_as_tools_and_answered_with_a_function_call(served):
    """`functions` / `function_call` (still in OpenAI's schema, and sent by clients written against it):
    the same grammar and prompt as the tools they stand for, the call as `function_call`, whole and streamed."""
    server, engine = served
    legacy = {"functions": [MULTIPLY["function"], CLOCK["function"]], "function_call": {"name": "multiply"}}
    status, body = await post(server, chat(**legacy))
    assert status == 200, body
    choice = ChatCompletion.model_validate(body).choices[0]
    assert choice.finish_reason == "function_call" and not choice.message.tool_calls
    assert choice.message.function_call.name == "multiply"
    assert json.loads(choice.message.function_call.arguments) == {"a": 37, "b": 43}
    assert engine.requests[-1].params.grammar.kind == "structural_tag"
    payload = await http(server, chat(**legacy, stream=True))
    lines = [line[6:] for line in payload.decode().splitlines() if line.startswith("data: ")]
    chunks = [ChatCompletionChunk.model_validate(json.loads(line)) for line in lines[:-1]]
    calls = [c.choices[0].delta.function_call for c in chunks if c.choices[0].delta.function_call]
    assert calls[0].name == "multiply" and json.loads("".join(c.arguments or "" for c in calls)) == {"a": 37, "b": 43}
    assert chunks[-1].choices[0].finish_reason == "function_call"
    status, body = await post(server, chat(functions=[MULTIPLY["function"]], function_call="none"))
    assert status == 200 and engine.requests[-1].params.grammar is None


async def test_a_deprecated_call_and_its_result_in_the_history_read_as_a_tool_call(served):
    server, engine = served
    history = [{"role": "user", "content": "What is 37 times 43?"},
               {"role": "assistant", "content": None,
                "function_call": {"name": "multiply", "arguments": '{"a": 37, "b": 43}'}},
               {"role": "function", "name": "multiply", "content": "1591"}]
    status, _ = await post(server, {"model": "fake-model", "messages": history,
                                    "functions": [MULTIPLY["function"]]})
    assert status == 200
    said = [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]
    assert f"assistant: {CALL}" in said and "tool: 1591" in said


async def test_tools_and_the_deprecated_functions_together_are_refused(served):
    server, _ = served
    status, body = await post(server, chat(tools=[MULTIPLY], functions=[MULTIPLY["function"]]))
    assert status == 400 and body["error"]["param"] == "functions"


async def test_none_and_no_tools_leave_the_reply_unconstrained(served):
    server, engine = served
    for extra in ({"tools": [MULTIPLY], "tool_choice": "none"}, {}):
        status, body = await post(server, chat(**extra))
        assert status == 200 and engine.requests[-1].params.grammar is None
        assert "tool_calls" not in body["choices"][0]["message"]  # the call text stays text


@pytest.mark.parametrize("fmt, kind", [({"type": "json_object"}, "json_object"),
                                       ({"type": "json_schema", "json_schema": {"name": "n", "strict": True,
                                        "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
                                        "json_schema")])
async def test_a_response_format_becomes_the_requests_grammar(served, fmt, kind):
    server, engine = served
    status, _ = await post(server, chat(response_format=fmt))
    assert status == 200 and engine.requests[-1].params.grammar.kind == kind


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [MULTIPLY], "tool_choice": {"type": "function", "function": {"name": "divide"}}}, "tool_choice"),
    ({"tools": [MULTIPLY, MULTIPLY]}, "tools"),
])
async def test_a_malformed_schema_or_tool_is_a_400_naming_the_field(served, extra, param):
    status, body = await post(served[0], chat(**extra))
    assert status == 400 and body["error"]["param"] == param, body


@pytest.mark.parametrize("text", [f"Let me check. {CALL}", CALL, "No call here, just <tool words.",
                                  tools.call_text("f", '{"s": "a}b"}')])
async def test_the_call_parser_gives_the_same_calls_however_the_text_is_split(text):
    whole = tools.FunctionCallParser()
    expected = whole.feed(text) + whole.flush()
    for size in (1, 2, 3, 7):
        parser = tools.FunctionCallParser()
        events = [e for start in range(0, len(text), size) for e in parser.feed(text[start:start + size])]
        events += parser.flush()
        said = "".join(v for k, v in events if k == "text")
        assert said == "".join(v for k, v in expected if k == "text")
        assert [(c.name, c.arguments) for c in parser.calls] == [(c.name, c.arguments) for c in whole.calls]
        assert "".join(v for k, v in events if k == "arguments") == "".join(c.arguments for c in parser.calls)
    if "<tool_call>" not in text:
        assert not whole.calls and "".join(v for _, v in expected) == text
