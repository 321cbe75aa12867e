"""Tools the server runs, measured with the real models on the native line: a spoken question whose reply
must call the sample MCP server's tool (`tool_choice: "required"`), in real time.

For a quick tool (`forecast`): the server's own time per MCP call, that is the time from
`response.mcp_call.in_progress` to `.completed` less what the same call takes the `mcp` SDK's client alone
(measured here, interleaved), and the first audio after the caller's last word. For a slow one
(`slow_forecast`, `slow_s`): when the filler's first audio came after the caller's last word, and the
answer's first audio after the tool's result."""

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


async def ask(url: str, tool: str, mcp_url: str, question: np.ndarray, limit_s: float = 60.0) -> dict:
    """One call, one spoken question, the reply made to call `tool`: the times that matter, on the caller's
    clock (from when its last sample went out)."""
    caller = await ScriptedCaller.call(url, {"type": "semantic_vad"})
    try:
        server = {"type": "mcp", "server_label": "weather", "server_url": mcp_url, "allowed_tools": [tool],
                  "require_approval": "never"}
        await caller.ws.send(json.dumps({"type": "session.update", "session": {
            "instructions": INSTRUCTIONS, "tools": [server], "tool_choice": "required"}}))
        if not await caller.until(lambda: bool(caller.of(ServerEvent.MCP_LIST_COMPLETED)), 30):
            raise RuntimeError(f"the MCP server's tools were not listed: {caller.of(ServerEvent.ERROR)}")
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
        try:
            await ask(url, "forecast", mcp_url, questions[0])  # warm: the grammar compiles, the prefix caches
            for n in range(tries):
                for tool in runs:
                    direct += await direct_call_s(mcp_url, "forecast", 3)
                    runs[tool].append(await ask(url, tool, mcp_url, questions[n % len(questions)]))
        finally:
            await server.close()
    return {"slow_s": slow_s, "direct_call_s": direct, "runs": runs, "summary": summarize(runs, direct)}


def summarize(runs: dict[str, list[dict]], direct: list[float]) -> dict:
    def p50(values: list) -> float | None:
        found = [v for v in values if v is not None]
        return round(percentile(found, 50), 3) if found else None

    quick, slow = runs["forecast"], runs["slow_forecast"]
    own = [r["call_s"] - statistics.median(direct) for r in quick if r["call_s"] is not None]
    return {"called": {tool: f"{sum(r['called'] for r in rs)}/{len(rs)}" for tool, rs in runs.items()},
            "direct_call_s_p50": p50(direct), "mcp_call_s_p50": p50([r["call_s"] for r in quick]),
            "server_own_s_p50": p50(own), "server_own_s_max": round(max(own), 3) if own else None,
            "quick_first_audio_s_p50": p50([r["first_audio_s"] for r in quick]),
            "slow_first_audio_s_p50": p50([r["first_audio_s"] for r in slow]),
            "slow_filler_before_result": f"{sum(r['filler_before_result'] for r in slow)}/{len(slow)}",
            "slow_answer_after_result_s_p50": p50([r["answer_after_result_s"] for r in slow])}


def print_tools(report: dict) -> None:
    s = report["summary"]
    print(f"calls made (tool_choice required): {s['called']}")
    print(f"quick tool: MCP call {s['mcp_call_s_p50']} s p50, the SDK's client alone {s['direct_call_s_p50']} s: "
          f"the server's own time {s['server_own_s_p50']} s p50 (max {s['server_own_s_max']}); first audio "
          f"{s['quick_first_audio_s_p50']} s after the last word")
    print(f"slow tool ({report['slow_s']:g} s): first audio {s['slow_first_audio_s_p50']} s after the last word, "
          f"a filler before the result in {s['slow_filler_before_result']}; the answer's audio "
          f"{s['slow_answer_after_result_s_p50']} s after the result")
