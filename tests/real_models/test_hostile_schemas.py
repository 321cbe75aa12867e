"""A client whose schema is within the limits but slow to compile: the request gets a 400 naming the field
(grammar_too_complex) once the compile budget runs out, a Realtime session's tools likewise an error
event, and meanwhile /health answers at once and another request is served. A real server over a tiny
random-weight engine (the real tokenizer's vocabulary) on a thread, with the real compile worker."""

import asyncio
import json
import time

import pytest
import pytest_asyncio
from support.fake_call import http_post
from support.helpers import get
from websockets.asyncio.client import connect

from scheduler import Engine, EngineConfig
from scheduler.channel.local import LocalEngine
from voicepipe.bench.random_weights import random_llm
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.server import VoiceServer

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
BUDGET_S = 0.5
# 1000 optional properties: within every schema limit, and some seconds to compile (the time grows with
# their square: 0.6 s for 400 here).
OPTIONAL = {"type": "object", "properties": {f"property_{i}": {"type": "integer"} for i in range(1000)}}
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    from voicepipe.backends.models import load_tokenizer

    tokenizer = load_tokenizer()
    model, _ = random_llm("tiny", vocab_size=len(tokenizer))
    engine = LocalEngine(Engine(model, tokenizer, EngineConfig(grammar_budget_s=BUDGET_S)))
    engine.start()
    runtime = Runtime(engine, tokenizer, "tiny", 16000, 16000)
    server = VoiceServer(runtime, Limits())
    await server.start("127.0.0.1", 0)
    status, _, _ = await http_post(server, chat(response_format=schema_format(SMALL)))  # the worker is up
    assert status == 200
    yield server
    await server.close()
    await engine.stop()


def chat(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 8, **extra}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


async def test_a_schema_past_the_compile_budget_gets_a_400_naming_it_while_others_are_served(server):
    hostile = asyncio.create_task(http_post(server, chat(response_format=schema_format(OPTIONAL)), timeout=30))
    t0 = time.monotonic()
    probes = []
    while not hostile.done():
        start = time.monotonic()
        assert (await get(server.port, "/health"))[0] == 200
        probes.append(time.monotonic() - start)
        await asyncio.sleep(0.05)
    status, _, payload = await hostile
    answered = time.monotonic() - t0
    error = json.loads(payload)["error"]
    assert status == 400 and error["code"] == "grammar_too_complex", error
    assert error["param"] == "response_format.json_schema.schema" and "compiling it" in error["message"]
    assert answered < 5.0 and max(probes) < 0.1, (answered, max(probes))
    status, _, payload = await http_post(server, chat(response_format=schema_format(SMALL)))
    assert status == 200 and json.loads(json.loads(payload)["choices"][0]["message"]["content"])["n"] in range(10)


async def test_a_tool_past_the_compile_budget_is_named_by_its_index(server):
    tools = [{"type": "function", "function": {"name": "ok", "parameters": SMALL}},
             {"type": "function", "function": {"name": "big", "parameters": OPTIONAL}}]
    status, _, payload = await http_post(server, chat(tools=tools), timeout=30)
    error = json.loads(payload)["error"]
    assert status == 400 and error["code"] == "grammar_too_complex" and error["param"] == "tools[1].function.parameters"


async def test_a_sessions_tools_past_the_compile_budget_are_refused_and_the_call_goes_on(server):
    async with connect(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"tools": [
            {"type": "function", "name": "big", "parameters": OPTIONAL}]}}))
        while (event := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != "error":
            pass
        assert event["error"]["code"] == "grammar_too_complex"
        assert event["error"]["param"] == "session.tools[0].parameters"
        await ws.send(json.dumps({"type": "session.update", "session": {"tools": [
            {"type": "function", "name": "small", "parameters": SMALL}]}}))
        while (event := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] != "session.updated":
            assert event["type"] != "error", event
        assert [t["name"] for t in event["session"]["tools"]] == ["small"]
