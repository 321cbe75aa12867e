"""Tools the server runs on MCP servers, over the fake engine and a real MCP server (the official `mcp`
SDK's, in a subprocess), through the `openai` SDK's Realtime client: the session names the server, the
server lists its tools (OpenAI's `mcp_list_tools` item), the model's call runs on it and the reply goes on
with its result in the same response; approvals, tool errors, timeouts and the operator's allow-list."""

import asyncio
import base64
import json
import sys
import time
from importlib import resources

import numpy as np
import openai
import pytest
import pytest_asyncio
from support.fake_call import fake_server, read_until
from support.realtime_types import GA_EVENTS, violations
from websockets.asyncio.client import connect as connect_ws

from voicepipe.audio import read_audio, to_pcm16
from voicepipe.bench.mcp_server import SERVER, free_port, serve_http
from voicepipe.call.limits import Limits
from voicepipe.constrained import tools
from voicepipe.mcp_servers import McpPolicy

pytestmark = pytest.mark.asyncio(loop_scope="module")
DEAD = f"http://127.0.0.1:{free_port()}/mcp"  # allowed, and nothing listens there
FORECAST = tools.call_text("forecast", '{"city": "Paris"}')
REPLIES = {"Book a table.": tools.call_text("book_table", '{"city": "Rome", "people": 2}'),
           "Is the service up?": tools.call_text("broken", '{"city": "Oslo"}'),
           "And in Lima?": tools.call_text("slow_forecast", '{"city": "Lima"}'),
           "And in Quito?": tools.call_text("slow_forecast", '{"city": "Quito"}')}


def mcp_tool(url: str, **fields) -> dict:
    return {"type": "mcp", "server_label": "weather", "server_url": url, "require_approval": "never", **fields}


async def connect(server, url: str, **fields):
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
    connection = await client.realtime.connect(model="voicepipe").enter()
    await connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                             "tools": [mcp_tool(url, **fields)]})
    return connection


async def ask(connection, text: str) -> tuple[object, list]:
    await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": text}]})
    await connection.response.create()
    seen: list = []
    return await read_until(connection, "response.done", seen), seen


@pytest.fixture(scope="module")
def weather():
    with serve_http(slow_s=1.5) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="module")
async def served(weather):
    async with fake_server(Limits(), reply=FORECAST, replies=REPLIES,
                           mcp=McpPolicy(allowed_urls=(weather, DEAD), call_timeout_s=3.0)) as served:
        yield served


async def test_a_session_s_mcp_server_is_listed_called_and_the_reply_goes_on_with_its_result(served, weather):
    server, engine = served
    connection = await connect(server, weather, allowed_tools=["forecast", "slow_forecast", "broken"])
    try:
        seen: list = []
        listed = await read_until(connection, "mcp_list_tools.completed", seen)
        item = next(e.item for e in seen if e.type == "conversation.item.done" and e.item.type == "mcp_list_tools")
        assert item.id == listed.item_id and {t.name for t in item.tools} == {"forecast", "slow_forecast", "broken"}
        started = time.monotonic()
        done, seen = await ask(connection, "Will it rain in Paris tomorrow?")
        kinds = [e.type for e in seen]
        for kind in ("response.mcp_call_arguments.done", "response.mcp_call.in_progress",
                     "response.mcp_call.completed"):
            assert kind in kinds
        assert kinds.index("response.mcp_call.completed") < kinds.index("response.done")
        call = next(o for o in done.response.output if o.type == "mcp_call")
        assert (call.name, call.server_label, json.loads(call.arguments)) == ("forecast", "weather", {"city": "Paris"})
        assert call.output == "Sunny in Paris, 21 degrees." and call.error is None
        message = next(o for o in done.response.output if o.type == "message")
        assert message.content[0].text.startswith("The answer is Sunny in Paris, 21 degrees")  # no round trip
        assert not any(e.type == "response.function_call_arguments.done" for e in seen)
        assert time.monotonic() - started < 5
        said = [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]
        assert f"assistant: {FORECAST}" in said and "tool: Sunny in Paris, 21 degrees." in said
        call_request, primed = engine.requests[-3:-1]
        assert any('"name": "forecast"' in engine.tokenizer.strings[i] for i in call_request.prompt)  # offered
        assert not any("You can call these functions" in s for s in said)  # the answer, in words, is not
        # While the call was written and ran, the answer's prompt up to the question was computed.
        assert primed.params.max_tokens == 1 and engine.requests[-1].prompt[:len(primed.prompt) - 1] == \
            primed.prompt[:-1]
    finally:
        await connection.close()


async def test_a_call_that_needs_approval_runs_once_the_client_approves_and_the_reply_follows(served, weather):
    server, engine = served
    connection = await connect(server, weather, require_approval={"never": {"read_only": True}})
    try:
        await read_until(connection, "mcp_list_tools.completed", [])
        done, seen = await ask(connection, "Book a table.")
        request = next(o for o in done.response.output if o.type == "mcp_approval_request")
        assert (request.name, json.loads(request.arguments)) == ("book_table", {"city": "Rome", "people": 2})
        assert not any(e.type.startswith("response.mcp_call") for e in seen)  # nothing ran
        await connection.conversation.item.create(item={"type": "mcp_approval_response",
                                                        "approval_request_id": request.id, "approve": True})
        seen = []
        done = await read_until(connection, "response.done", seen)
        call = next(o for o in done.response.output if o.type == "mcp_call")
        assert call.approval_request_id == request.id and call.output == "Booked a table for 2 in Rome."
        assert next(o for o in done.response.output if o.type == "message").content[0].text.startswith(
            "The answer is Booked a table")
        # A read-only tool needs none (`never` picks it).
        done, _ = await ask(connection, "Will it rain in Paris tomorrow?")
        assert next(o for o in done.response.output if o.type == "mcp_call").output.startswith("Sunny")
    finally:
        await connection.close()


async def test_a_declined_call_never_runs_and_the_model_hears_it_was_declined(served, weather):
    server, engine = served
    connection = await connect(server, weather, require_approval="always")
    try:
        await read_until(connection, "mcp_list_tools.completed", [])
        done, _ = await ask(connection, "Book a table.")
        request = next(o for o in done.response.output if o.type == "mcp_approval_request")
        await connection.conversation.item.create(item={"type": "mcp_approval_response",
                                                        "approval_request_id": request.id, "approve": False})
        seen: list = []
        done = await read_until(connection, "response.done", seen)
        assert not any(o.type == "mcp_call" for o in done.response.output)
        said = [engine.tokenizer.strings[i] for i in engine.requests[-1].prompt]
        assert any(s.startswith("tool: The caller declined the call to book_table") for s in said)
        await connection.conversation.item.create(item={"type": "mcp_approval_response",
                                                        "approval_request_id": request.id, "approve": True})
        error = await read_until(connection, "error", [])
        assert error.error.code == "item_not_found"  # answered once only
    finally:
        await connection.close()


async def test_a_failing_tool_and_a_slow_one_end_in_an_answer_that_says_so_and_the_call_goes_on(weather):
    policy = McpPolicy(allowed_urls=(weather,), call_timeout_s=0.5)
    async with fake_server(Limits(), reply=FORECAST, replies=REPLIES, mcp=policy) as (server, engine):
        connection = await connect(server, weather)
        try:
            await read_until(connection, "mcp_list_tools.completed", [])
            for question, expected in (("Is the service up?", "the weather service is down"),
                                       ("And in Lima?", "slow_forecast took longer than 0.5 s")):
                started = time.monotonic()
                done, seen = await ask(connection, question)
                call = next(o for o in done.response.output if o.type == "mcp_call")
                assert call.output is None and expected in call.error.message
                assert "response.mcp_call.failed" in [e.type for e in seen]
                assert next(o for o in done.response.output if o.type == "message").content[0].text.startswith(
                    "The answer is The tool failed")
                assert time.monotonic() - started < 1.5  # within the timeout, not the tool's 1.5 s
            done, _ = await ask(connection, "Will it rain in Paris tomorrow?")  # the server still answers
            assert next(o for o in done.response.output if o.type == "mcp_call").output.startswith("Sunny")
        finally:
            await connection.close()


async def test_a_slow_tool_gets_a_spoken_filler_before_its_answer_in_the_same_response(served, weather):
    server, engine = served
    connection = await connect(server, weather)
    await connection.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
    try:
        await read_until(connection, "mcp_list_tools.completed", [])
        started = time.monotonic()
        done, seen = await ask(connection, "And in Quito?")
        kinds = [e.type for e in seen]
        transcript = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
        assert transcript.startswith("One moment, let me check. The answer is Rain in Quito")
        first_audio = kinds.index("response.output_audio.delta")
        assert first_audio < kinds.index("response.mcp_call.completed")  # heard while the tool ran
        assert next(o for o in done.response.output if o.type == "mcp_call").output == "Rain in Quito."
        assert time.monotonic() - started >= 1.5
    finally:
        await connection.close()


async def test_a_server_off_the_allow_list_is_refused_and_a_dead_one_fails_its_listing_alone(served, weather):
    server, engine = served
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
    async with client.realtime.connect(model="voicepipe") as connection:
        await connection.session.update(session={"type": "realtime", "tools": [
            mcp_tool("http://169.254.169.254/latest/meta-data")]})
        error = await read_until(connection, "error", [])
        assert error.error.code == "invalid_session_update" and "allow-list" in error.error.message
        assert error.error.param == "session.tools[0].server_url"
        await connection.session.update(session={"type": "realtime", "tools": [
            mcp_tool(DEAD)]})
        seen: list = []
        await read_until(connection, "mcp_list_tools.failed", seen)
        error = await read_until(connection, "error", seen)
        assert error.error.code == "mcp_list_tools_failed"
        done, _ = await ask(connection, "Will it rain in Paris tomorrow?")  # no tools: the call text is spoken
        assert done.response.status == "completed"


async def test_an_operator_s_stdio_server_is_named_by_its_label_alone(weather):
    policy = McpPolicy.from_flags([f"weather=stdio:{sys.executable} {' '.join(SERVER)} stdio"], [])
    async with fake_server(Limits(), reply=FORECAST, mcp=policy) as (server, engine):
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                    websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
        async with client.realtime.connect(model="voicepipe") as connection:
            await connection.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                                     "tools": [{"type": "mcp", "server_label": "weather"}]})
            updated = await read_until(connection, "session.updated", [])
            assert updated.session.tools[0].server_label == "weather"
            await read_until(connection, "mcp_list_tools.completed", [])
            done, _ = await ask(connection, "Will it rain in Paris tomorrow?")
            assert next(o for o in done.response.output if o.type == "mcp_call").output.startswith("Sunny")


async def test_every_mcp_event_and_item_matches_the_openai_types(served, weather):
    """Listing, a call with its result, a failed call, an approval request and the approved call, as raw
    events against the `openai` package's Realtime types (no undeclared field)."""
    server, _ = served
    async with connect_ws(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
        events: list[dict] = []

        async def until(kind: str) -> dict:
            while True:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
                if events[-1]["type"] == kind:
                    return events[-1]

        async def ask(text: str) -> dict:
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            return await until("response.done")

        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "tools": [
            mcp_tool(weather, require_approval={"always": {"tool_names": ["book_table"]}})]}}))
        await until("mcp_list_tools.completed")
        await ask("Will it rain in Paris tomorrow?")
        await ask("Is the service up?")
        done = await ask("Book a table.")
        request = next(o for o in done["response"]["output"] if o["type"] == "mcp_approval_request")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}}))
        await until("response.done")
    kinds = {e["type"] for e in events}
    assert {"mcp_list_tools.in_progress", "mcp_list_tools.completed", "response.mcp_call_arguments.delta",
            "response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed",
            "response.mcp_call.failed"} <= kinds
    wrong = [v for event in events for v in violations(event, GA_EVENTS)]
    assert not wrong, "\n".join(wrong)


def speech_24k() -> bytes:
    """The packaged spoken question at the Realtime rate, then a second of silence to end the turn."""
    voice = read_audio(resources.files("voicepipe.samples") / "question.wav", 24000)
    return to_pcm16(np.concatenate([voice, np.zeros(24000, np.float32)])).tobytes()


@pytest.mark.parametrize("interrupt", [False, True])
async def test_a_barge_in_leaves_a_tool_running_when_asked_and_its_result_is_answered_when_it_lands(weather,
                                                                                                 interrupt):
    """The caller speaks over a slow tool's filler: with `interrupt_tool_calls: false` the tool runs on, the
    caller's words are answered first, and a reply of its own answers with the result once it lands; by
    default the barge-in cancels the call with the reply, and nothing answers it later."""
    policy = McpPolicy(allowed_urls=(weather,), call_timeout_s=5.0)
    replies = {**REPLIES, "Never mind.": "All right."}
    async with fake_server(Limits(), reply=FORECAST, replies=replies, heard="And in Quito?", mcp=policy) as (
            server, engine):
        async with connect_ws(f"ws://127.0.0.1:{server.port}/v1/realtime") as ws:
            events: list[dict] = []

            async def until(kind: str, timeout_s: float = 20) -> dict:
                while True:
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), timeout_s)))
                    if events[-1]["type"] == kind:
                        return events[-1]

            async def speak() -> None:
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(speech_24k()).decode()}))

            await ws.send(json.dumps({"type": "session.update", "session": {"interrupt_tool_calls": "no"}}))
            error = (await until("error"))["error"]
            assert (error["code"], error["param"]) == ("invalid_session_update", "interrupt_tool_calls")
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "tools": [mcp_tool(weather)], "interrupt_tool_calls": interrupt,
                "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}}))
            assert (await until("session.updated"))["session"]["interrupt_tool_calls"] is interrupt
            await until("mcp_list_tools.completed")
            await speak()
            await until("response.mcp_call.in_progress")  # slow_forecast: 1.5 s
            engine.asr.text = "Never mind."
            await speak()
            first = await until("response.done")
            assert first["response"]["status"] == "cancelled"
            assert first["response"]["status_details"]["reason"] == "turn_detected"
            answered = await until("response.done")
            assert answered["response"]["output"][0]["content"][0]["transcript"] == "All right."
            if interrupt:
                with pytest.raises(TimeoutError):
                    await until("response.done", timeout_s=3.0)
                return
            late = await until("response.done")
            call = next(o for o in late["response"]["output"] if o["type"] == "mcp_call")
            assert (call["name"], call["output"]) == ("slow_forecast", "Rain in Quito.")
            message = next(o for o in late["response"]["output"] if o["type"] == "message")
            assert message["content"][0]["transcript"].startswith("The answer is Rain in Quito")
            wrong = [v for event in events for v in violations(event, GA_EVENTS)]
            assert not wrong, "\n".join(wrong)


async def test_a_response_s_own_mcp_server_is_listed_and_called_for_that_reply_alone(served, weather):
    server, _ = served
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
    async with client.realtime.connect(model="voicepipe") as connection:
        await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        own = {"tools": [mcp_tool(weather, allowed_tools=["forecast"])], "tool_choice": "required"}
        for listed in (True, False):  # the second time, the server listed for the first is used again
            seen: list = []
            await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Will it rain in Paris tomorrow?"}]})
            await connection.response.create(response=own)
            done = await read_until(connection, "response.done", seen)
            assert ("mcp_list_tools.completed" in [e.type for e in seen]) is listed
            call = next(o for o in done.response.output if o.type == "mcp_call")
            assert (call.name, call.output) == ("forecast", "Sunny in Paris, 21 degrees.")
            message = next(o for o in done.response.output if o.type == "message")
            assert message.content[0].text.startswith("The answer is Sunny in Paris")
        await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "And the day after?"}]})
        await connection.response.create()  # the session's tools again: none, so the call is only words
        done = await read_until(connection, "response.done", [])
        assert [o.type for o in done.response.output] == ["message"]
        await connection.response.create(response={"tools": [mcp_tool("http://169.254.169.254/mcp")]})
        error = await read_until(connection, "error", [])
        assert error.error.code == "invalid_response" and error.error.param == "response.tools[0].server_url"


async def test_a_tool_choice_alone_in_a_response_keeps_the_session_s_mcp_tools(served, weather):
    """A `response.create` that gives only `tool_choice` chooses among the session's tools, its servers'
    listed ones included: the call runs on the server, not handed to the client as a function."""
    server, _ = served
    connection = await connect(server, weather)
    try:
        await read_until(connection, "mcp_list_tools.completed", [])
        await connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Will it rain in Paris tomorrow?"}]})
        await connection.response.create(response={"tool_choice": "required"})
        done = await read_until(connection, "response.done", [])
        assert [o.type for o in done.response.output] == ["message", "mcp_call"]
        assert next(o for o in done.response.output if o.type == "mcp_call").output.startswith("Sunny")
        # The session's own choice may name a listed server tool too.
        await connection.session.update(session={"type": "realtime", "tool_choice": {
            "type": "function", "name": "forecast"}})
        assert (await read_until(connection, "session.updated", [])).session.tool_choice.name == "forecast"
        await connection.session.update(session={"type": "realtime", "tool_choice": "auto", "tools": [
            {**mcp_tool(DEAD), "server_label": "other"}, mcp_tool(weather)]})
        await read_until(connection, "mcp_list_tools.failed", [])  # "other" is the session's, if dead
        assert (await read_until(connection, "error", [])).error.code == "mcp_list_tools_failed"
        await connection.response.create(response={"tools": [{**mcp_tool(weather), "server_label": "other"}]})
        error = await read_until(connection, "error", [])
        assert error.error.code == "invalid_response" and "already names another server" in error.error.message
    finally:
        await connection.close()


async def test_a_response_cancelled_while_its_server_is_listed_never_starts():
    """A server that accepts the connection and never answers: the response naming it waits for its listing,
    and a `response.cancel` meanwhile means it never starts; uncancelled, it starts when the listing times
    out."""
    async def hold(reader, writer) -> None:
        await reader.read()  # never answers

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}/mcp"
    try:
        async with fake_server(Limits(), reply="Fine.", mcp=McpPolicy(allowed_urls=(url,), list_timeout_s=0.5)) as (
                server, _):
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused",
                                        websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
            async with client.realtime.connect(model="voicepipe") as connection:
                await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
                await connection.response.create(response={"tools": [mcp_tool(url)]})
                seen: list = []
                await read_until(connection, "mcp_list_tools.in_progress", seen)
                await connection.response.cancel()
                with pytest.raises(TimeoutError):
                    await read_until(connection, "response.created", seen, timeout_s=2.5)
                await connection.response.create()  # the call goes on
                assert (await read_until(connection, "response.done", seen)).response.status == "completed"
                # Not cancelled, the response starts once the listing gives up (0.5 s), without the server's
                # tools: closing a connection still being made does not wait for it (it took 5.5 s).
                started = time.monotonic()
                await connection.response.create(response={"tools": [mcp_tool(url)]})
                await read_until(connection, "mcp_list_tools.failed", seen)
                assert (await read_until(connection, "response.done", seen)).response.status == "completed"
                assert time.monotonic() - started < 2.5
    finally:
        silent.close()
