"""The text API cannot run away: unsupported parameters (log probabilities, several choices) are
refused by name, a request gets a bounded length, at most N wait or run at once (429 beyond), a client
that leaves a whole answer aborts it, and unknown paths answer in OpenAI's shape. A real server over the
fake engine: milliseconds."""

import asyncio
import json
import time

import pytest
import pytest_asyncio
from support.fake_call import fake_server, post
from websockets.asyncio.client import connect

from voicepipe.call.limits import Limits

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def served():
    async with fake_server(Limits(max_text_requests=2, text_max_tokens=5)) as served:
        yield served


def chat(**extra) -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Hello?"}], **extra}


@pytest.mark.parametrize("extra, param", [
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": 2}, "n"),
])
async def test_parameters_not_supported_are_refused_by_name(served, extra, param):
    status, _, body = await post(served[0], chat(**extra))
    assert status == 400 and body["error"]["param"] == param and body["error"]["code"] == "unsupported_parameter"


async def test_content_parts_other_than_text_are_refused_by_name_and_text_parts_are_read(served):
    server, engine = served
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
    status, _, body = await post(server, {**chat(), "messages": [audio]})
    assert status == 400 and "'input_audio'" in body["error"]["message"]
    assert body["error"]["param"].startswith("messages.0.content")
    parts = {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}
    status, _, body = await post(server, {**chat(), "messages": [parts, *chat()["messages"]]})
    assert status == 200 and "system: Be brief." in [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]


async def test_a_request_gets_a_bounded_length_and_a_refusal_field(served):
    server, engine = served
    status, _, body = await post(server, chat(response_format={"type": "text"}, tool_choice="none"))
    assert status == 200 and body["choices"][0]["message"]["refusal"] is None
    assert engine.requests[-1].params.max_tokens == 5  # none given: the server's bound
    await post(server, chat(max_tokens=100_000))
    assert engine.requests[-1].params.max_tokens == 5  # asked for more: the same bound


async def test_more_text_requests_than_allowed_are_answered_429(served):
    server, engine = served
    engine.gate.clear()  # the engine is busy: nothing finishes
    held = [asyncio.create_task(post(server, chat())) for _ in range(2)]
    while sum(not r.closed for r in engine.requests) < 2:
        await asyncio.sleep(0.01)
    status, headers, body = await post(server, chat())
    assert status == 429 and headers["retry-after"] == "1" and body["error"]["code"] == "too_many_requests"
    engine.gate.set()
    assert [status for status, _, _ in await asyncio.gather(*held)] == [200, 200]
    assert (await post(server, chat()))[0] == 200  # room again


async def test_a_full_text_queue_answers_429_while_a_call_beside_it_is_answered(served):
    server, engine = served
    engine.gate.clear()
    engine.gated = lambda question: question == "Hello?"  # text requests stall; the call's do not
    try:
        held = [asyncio.create_task(post(server, chat())) for _ in range(2)]
        while sum(not r.closed for r in engine.requests) < 2:
            await asyncio.sleep(0.01)
        assert (await post(server, chat()))[0] == 429
        async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "And the call?"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            while (event := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "response.done":
                pass
        assert event["response"]["status"] == "completed"
        assert (await post(server, chat()))[0] == 429  # the text requests still hold every slot
    finally:
        engine.gated = lambda question: True
        engine.gate.set()
    assert [status for status, _, _ in await asyncio.gather(*held)] == [200, 200]


async def test_a_client_leaving_a_whole_answer_aborts_its_request(served):
    server, engine = served
    engine.gate.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    data = json.dumps(chat())
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n{data}".encode())
    while not engine.requests or engine.requests[-1].closed:
        await asyncio.sleep(0.01)
    request = engine.requests[-1]
    writer.close()
    end = time.monotonic() + 1.0
    while not request.closed:
        assert time.monotonic() < end, "the request went on after its client left"
        await asyncio.sleep(0.01)
    assert request.tokens == 0
    engine.gate.set()


async def test_an_unknown_path_answers_404_in_openai_shape(served):
    status, _, body = await post(served[0], {}, "/v1/embeddings")
    assert status == 404 and body["error"]["code"] == "unknown_url"

