"""Tools the server runs, measured with the real models on the native line: a spoken question whose reply
must call the sample MCP server's tool (`tool_choice: "required"`), in real time.

For a quick tool (`forecast`): the server's own time per MCP call, that is the time from
`response.mcp_call.in_progress` to `.completed` less what the same call takes the `mcp` SDK's client alone
(measured here, interleaved), and the first audio after the caller's last word. For a slow one
(`slow_forecast`, `slow_s`): when the filler's first audio came after the caller's last word, and the
answer's first audio after the tool's result. The same for a function the client runs (it sends the output
`slow_s` after the call). And the caller speaking over a slow tool (`interrupt_tool_calls: false`): when
their new question is answered, and when the tool's own answer follows its result."""

import asyncio
import json
import statistics
import time

import numpy as np

from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.mcp_server import serve_http
from voicepipe.bench.scripted_caller import AUDIO, RATE, ScriptedCaller
from voicepipe.bench.turn_set import say_with
from voicepipe.call.runtime import Runtime
from voicepipe.mcp_servers import McpPolicy
from voicepipe.protocol import ServerEvent

QUESTIONS = ("What will the weather be like in Paris tomorrow?", "Will it rain in Madrid tomorrow?",
             "What is the weather forecast for Berlin tomorrow?")
INSTRUCTIONS = "You are a weather assistant on the phone. Answer in one short sentence."
SECOND = "Thank you. What should I wear for a walk?"
FUNCTION = {"type": "function", "name": "forecast", "description": "The weather forecast for a city tomorrow.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def direct_call_s(url: str, tool: str, runs: int) -> list[float]:
    """How long the `mcp` SDK's own client takes to call `tool` (the MCP server's time, as a client sees it)."""
    from mcp import Client

    took = []
    async with Client(url) as client:
        for _ in range(runs):
            started = time.perf_counter()
            await client.call_tool(tool, {"city": "Paris"})
            took.append(time.perf_counter() - started)
    return took


async def name_server(caller: ScriptedCaller, mcp_url: str, tool: str, **session) -> None:
    """The session names the sample MCP server, allowing `tool` alone, and must call it; once it is listed."""
    server = {"type": "mcp", "server_label": "weather", "server_url": mcp_url, "allowed_tools": [tool],
              "require_approval": "never"}
    await caller.ws.send(json.dumps({"type": "session.update", "session": {
        "instructions": INSTRUCTIONS, "tools": [server], "tool_choice": "required", **session}}))
    if not await caller.until(lambda: bool(caller.of(ServerEvent.MCP_LIST_COMPLETED)), 30):
        raise RuntimeError(f"the MCP server's tools were not listed: {caller.of(ServerEvent.ERROR)}")


async def ask(url: str, tool: str, mcp_url: str, question: np.ndarray, limit_s: float = 60.0) -> dict:
    """One call, one spoken question, the reply made to call `tool`: the times that matter, on the caller's
    clock (from when its last sample went out)."""
    caller = await ScriptedCaller.call(url, {"type": "semantic_vad"})
    try:
        await name_server(caller, mcp_url, tool)
        caller.say(np.zeros(int(0.3 * RATE), np.float32))
        _, speech_end = caller.say(question)
        await caller.until(lambda: bool(caller.of(ServerEvent.RESPONSE_DONE)), limit_s)
        await asyncio.sleep(0.5)  # the last of its audio
    finally:
        await caller.close()
    running = caller.first(ServerEvent.MCP_CALL_IN_PROGRESS)
    result = caller.first(ServerEvent.MCP_CALL_COMPLETED) or caller.first(ServerEvent.MCP_CALL_FAILED)
    first_audio = caller.first(AUDIO, speech_end)
    done = caller.of(ServerEvent.RESPONSE_DONE)
    calls = [o for o in done[0]["response"]["output"] if o["type"] == "mcp_call"] if done else []
    return {"tool": tool, "called": bool(calls), "output": calls[0]["output"] if calls else None,
            "said": done[0]["response"]["output"][0]["text"] if done else None,
            "first_audio_s": None if first_audio is None else first_audio - speech_end,
            "call_s": None if running is None or result is None else result - running,
            "answer_after_result_s": None if result is None or caller.first(AUDIO, result) is None
            else caller.first(AUDIO, result) - result,
            "filler_before_result": first_audio is not None and result is not None and first_audio < result}


def first_audio_of(caller: ScriptedCaller, response_id: str) -> float | None:
    """When the first audio of one response reached the caller."""
    return next((t for t, k, e in caller.events
                 if k == ServerEvent.RESPONSE_AUDIO_DELTA and e.get("response_id") == response_id), None)


async def ask_client_function(url: str, question: np.ndarray, slow_s: float, limit_s: float = 60.0) -> dict:
    """A spoken question whose reply calls a function the client runs, answering `slow_s` after the call:
    when the filler was heard after the last word, and the answer after the output was sent."""
    caller = await ScriptedCaller.call(url, {"type": "semantic_vad"})
    try:
        await caller.ws.send(json.dumps({"type": "session.update", "session": {
            "instructions": INSTRUCTIONS, "tools": [FUNCTION], "tool_choice": "required"}}))
        await caller.until(lambda: len(caller.of(ServerEvent.SESSION_UPDATED)) > 1, 30)
        caller.say(np.zeros(int(0.3 * RATE), np.float32))
        _, speech_end = caller.say(question)
        await caller.until(lambda: bool(caller.of(ServerEvent.CALL_ARGUMENTS_DONE)), limit_s)
        called = caller.of(ServerEvent.CALL_ARGUMENTS_DONE)
        if not called:
            return {"called": False}
        await asyncio.sleep(slow_s)
        await caller.ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": called[0]["call_id"], "output": "Rain, 14 degrees."}}))
        await caller.ws.send(json.dumps({"type": "response.create", "response": {"tool_choice": "none"}}))
        output_at = time.monotonic()
        await caller.until(lambda: caller.first(AUDIO, output_at) is not None, limit_s)
        await asyncio.sleep(0.5)
    finally:
        await caller.close()
    filler = caller.first(AUDIO, speech_end)
    answer = caller.first(AUDIO, output_at)
    return {"called": True, "filler_s": None if filler is None or filler > output_at else filler - speech_end,
            "answer_after_output_s": None if answer is None else answer - output_at}


async def ask_over_tool(url: str, mcp_url: str, question: np.ndarray, second: np.ndarray, slow_s: float,
                        limit_s: float = 60.0) -> dict:
    """A spoken question whose reply calls the slow tool; a second after the call starts the caller asks
    something else. With `interrupt_tool_calls: false`: when the new question is answered (after its last
    word), and when the tool's own answer is heard after its result (the call's start plus `slow_s`)."""
    caller = await ScriptedCaller.call(url, {"type": "semantic_vad"})
    try:
        await name_server(caller, mcp_url, "slow_forecast", interrupt_tool_calls=False)
        caller.say(np.zeros(int(0.3 * RATE), np.float32))
        caller.say(question)
        await caller.until(lambda: bool(caller.of(ServerEvent.MCP_CALL_IN_PROGRESS)), limit_s)
        running = caller.first(ServerEvent.MCP_CALL_IN_PROGRESS)
        if running is None:
            return {"called": False}
        # The next question is answered in words (the small model calls a tool whenever it may).
        await caller.ws.send(json.dumps({"type": "session.update", "session": {"tool_choice": "none"}}))
        await asyncio.sleep(max(0.0, running + 1.0 - time.monotonic()))
        _, second_end = caller.say(second)
        first_id = caller.of(ServerEvent.MCP_CALL_IN_PROGRESS)[0]["response_id"]

        def later() -> tuple[dict | None, list[dict]]:
            """The reply that answered with the tool's result, and the others after the first."""
            done = [e for e in caller.of(ServerEvent.RESPONSE_DONE) if e["response"]["id"] != first_id]
            late = next((e for e in done if any(o["type"] == "mcp_call" and o.get("output")
                                                for o in e["response"]["output"])), None)
            return late, [e for e in done if e is not late and e["response"]["status"] == "completed"]

        await caller.until(lambda: all(later()), limit_s)
        await asyncio.sleep(0.5)
    finally:
        await caller.close()
    landed = running + slow_s
    late, answered = later()
    second_audio = caller.first(AUDIO, second_end)
    late_audio = None if late is None else first_audio_of(caller, late["response"]["id"])
    # When the late answer could begin: the result landed and the caller's own reply had been written.
    free = max([landed, *(t for t, k, e in caller.events if k == ServerEvent.RESPONSE_DONE
                          and e["response"]["id"] in {a["response"]["id"] for a in answered})])
    return {"called": True, "second_answered": bool(answered),
            "second_first_audio_s": None if second_audio is None else second_audio - second_end,
            "late_answer_after_result_s": None if late_audio is None else late_audio - landed,
            "late_answer_after_free_s": None if late_audio is None else late_audio - free,
            "late_said": None if late is None else next(
                (o for o in late["response"]["output"] if o["type"] == "message"), {}).get("text")}


async def bench_tools(runtime: Runtime, tts, tries: int, slow_s: float) -> dict:
    """Each question `tries` times with each tool, on a server over `runtime` allowing the sample MCP server."""
    from voicepipe.call.limits import Limits
    from voicepipe.server import VoiceServer

    questions = [say_with(tts, text) for text in QUESTIONS]
    with serve_http(slow_s) as mcp_url:
        runtime.mcp = McpPolicy(allowed_urls=(mcp_url,))
        server = VoiceServer(runtime, Limits())
        await server.start("127.0.0.1", 0)
        url = f"ws://127.0.0.1:{server.port}/ws"
        runs: dict[str, list[dict]] = {"forecast": [], "slow_forecast": []}
        direct: list[float] = []
        client, over = [], []
        second = say_with(tts, SECOND)
        try:
            await ask(url, "forecast", mcp_url, questions[0])  # warm: the grammar compiles, the prefix caches
            for n in range(tries):
                question = questions[n % len(questions)]
                for tool in runs:
                    direct += await direct_call_s(mcp_url, "forecast", 3)
                    runs[tool].append(await ask(url, tool, mcp_url, question))
                client.append(await ask_client_function(url, question, slow_s))
                over.append(await ask_over_tool(url, mcp_url, question, second, slow_s))
        finally:
            await server.close()
    summary = {**summarize(runs, direct), **summarize_waits(client, over)}
    return {"slow_s": slow_s, "direct_call_s": direct, "runs": runs, "client_function": client,
            "spoken_over": over, "summary": summary}


def p50(values: list) -> float | None:
    found = [v for v in values if v is not None]
    return round(percentile(found, 50), 3) if found else None


def summarize(runs: dict[str, list[dict]], direct: list[float]) -> dict:
    quick, slow = runs["forecast"], runs["slow_forecast"]
    own = [r["call_s"] - statistics.median(direct) for r in quick if r["call_s"] is not None]
    return {"called": {tool: f"{sum(r['called'] for r in rs)}/{len(rs)}" for tool, rs in runs.items()},
            "direct_call_s_p50": p50(direct), "mcp_call_s_p50": p50([r["call_s"] for r in quick]),
            "server_own_s_p50": p50(own), "server_own_s_max": round(max(own), 3) if own else None,
            "quick_first_audio_s_p50": p50([r["first_audio_s"] for r in quick]),
            "slow_first_audio_s_p50": p50([r["first_audio_s"] for r in slow]),
            "slow_filler_before_result": f"{sum(r['filler_before_result'] for r in slow)}/{len(slow)}",
            "slow_answer_after_result_s_p50": p50([r["answer_after_result_s"] for r in slow])}


def summarize_waits(client: list[dict], over: list[dict]) -> dict:
    return {"client_called": f"{sum(r['called'] for r in client)}/{len(client)}",
            "client_filler_s_p50": p50([r.get("filler_s") for r in client]),
            "client_answer_after_output_s_p50": p50([r.get("answer_after_output_s") for r in client]),
            "over_called": f"{sum(r['called'] for r in over)}/{len(over)}",
            "over_second_answered": f"{sum(r.get('second_answered', False) for r in over)}/{len(over)}",
            "over_second_first_audio_s_p50": p50([r.get("second_first_audio_s") for r in over]),
            "over_late_answered": f"{sum(r.get('late_answer_after_result_s') is not None for r in over)}/{len(over)}",
            "over_late_answer_after_result_s_p50": p50([r.get("late_answer_after_result_s") for r in over]),
            "over_late_answer_after_free_s_p50": p50([r.get("late_answer_after_free_s") for r in over])}


def print_tools(report: dict) -> None:
    s = report["summary"]
    print(f"calls made (tool_choice required): {s['called']}")
    print(f"quick tool: MCP call {s['mcp_call_s_p50']} s p50, the SDK's client alone {s['direct_call_s_p50']} s: "
          f"the server's own time {s['server_own_s_p50']} s p50 (max {s['server_own_s_max']}); first audio "
          f"{s['quick_first_audio_s_p50']} s after the last word")
    print(f"slow tool ({report['slow_s']:g} s): first audio {s['slow_first_audio_s_p50']} s after the last word, "
          f"a filler before the result in {s['slow_filler_before_result']}; the answer's audio "
          f"{s['slow_answer_after_result_s_p50']} s after the result")
    print(f"a function the client runs ({report['slow_s']:g} s; called {s['client_called']}): filler "
          f"{s['client_filler_s_p50']} s after the last word, the answer's audio "
          f"{s['client_answer_after_output_s_p50']} s after the output was sent")
    print(f"spoken over the slow tool (called {s['over_called']}): the new question answered in "
          f"{s['over_second_answered']}, {s['over_second_first_audio_s_p50']} s after its last word; the tool's "
          f"answer heard in {s['over_late_answered']}, {s['over_late_answer_after_result_s_p50']} s after its result "
          f"({s['over_late_answer_after_free_s_p50']} s after the caller's own reply was written)")
