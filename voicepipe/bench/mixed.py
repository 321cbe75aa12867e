"""`voicepipe bench mixed`: what mini-O4 is for. M streams of long-prompt `/v1/chat/completions` requests
keep the engine busy, first alone, then while K simulated callers speak over the websocket; per policy,
the calls' time to first audio and on-time rate beside the API's throughput and time to first token, so
what the calls cost the API and what the API costs the calls show side by side."""

import asyncio
import itertools
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import openai

from voicepipe.backends.base import chat_prompt_ids
from voicepipe.backends.loading import ModelOptions
from voicepipe.bench.calls import HeardTurn, bench_runtime, caller, print_waterfall, spoken_questions, waterfall_figures
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.steps import StepLog, quiet_steps, step_figures
from voicepipe.bench.workload import FILLER, TOPICS, ApiLoad
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.pipeline import CallConfig
from voicepipe.server import VoiceServer

log = logging.getLogger(__name__)
PROMPTS_PER_STREAM = 4
ON_TIME_TARGET, API_RATIO_TARGET = 0.95, 0.80


@dataclass
class ApiRequest:
    sent: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text
    tokens: int | None = None  # completion tokens from the usage chunk; None until the request finishes

    def tokens_between(self, start: float, end: float) -> float:
        """Tokens streamed in [start, end). A chunk carries one token's text, except where a token completes
        no character yet, so a finished request's usage count is spread over its chunks."""
        if not self.chunk_times:
            return 0.0
        per_chunk = self.tokens / len(self.chunk_times) if self.tokens else 1.0
        return per_chunk * sum(start <= t < end for t in self.chunk_times)


def api_prompts(tokenizer, count: int, tokens: int, seed: int = 0) -> list[str]:
    """`count` user messages of about `tokens` tokens with the chat template, each worded differently from
    its first sentence on, so that no two share a cached prefix or one predictable answer."""
    rng = random.Random(seed)
    sentences = [FILLER.strip()] + [f"Compare {a} with {b}." for a in TOPICS for b in TOPICS if a != b]
    overhead = len(chat_prompt_ids(tokenizer, [{"role": "user", "content": ""}]))
    repeats = 1 + tokens // 500  # the sentences make about 750 tokens
    prompts = []
    for i in range(count):
        body = [s for _ in range(repeats) for s in rng.sample(sentences, len(sentences))]
        text = f"Question {i}: tell me about {TOPICS[i % len(TOPICS)]}. " + " ".join(body)
        ids = tokenizer.encode(text, add_special_tokens=False)[:max(1, tokens - overhead)]
        prompts.append(tokenizer.decode(ids))
    return prompts


async def api_stream(client: openai.AsyncOpenAI, model: str, prompts: list[str], max_tokens: int,
                     requests: list[ApiRequest]) -> None:
    """One API client: streams one completion after another until cancelled, logging each in `requests`."""
    for prompt in itertools.cycle(prompts):
        request = ApiRequest(time.monotonic())
        requests.append(request)
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True})
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    request.tokens = chunk.usage.completion_tokens
                elif chunk.choices and chunk.choices[0].delta.content:
                    request.chunk_times.append(time.monotonic())


def api_figures(requests: list[ApiRequest], start: float, end: float) -> dict:
    """Throughput over [start, end); time to first token of the requests sent in it."""
    ttfts = [r.chunk_times[0] - r.sent for r in requests if start <= r.sent < end and r.chunk_times]
    return {"tokens_per_s": sum(r.tokens_between(start, end) for r in requests) / (end - start),
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
            "requests_sent": sum(1 for r in requests if start <= r.sent < end), "window_s": end - start}


def call_figures(results: list[HeardTurn], deadline_s: float) -> dict:
    """A turn is on time when the server met its deadline and the caller heard audio within it too."""
    ttfas = [r.ttfa_s for r in results if r.ttfa_s is not None]
    on_time = sum(1 for r in results if r.deadline_met and r.ttfa_s is not None and r.ttfa_s <= deadline_s)
    return {"turns": len(results), "ttfa_p50_s": percentile(ttfas, 50), "ttfa_p95_s": percentile(ttfas, 95),
            "on_time_rate": on_time / len(results),
            "within_1_5_s": sum(1 for t in ttfas if t <= 1.5) / len(results),
            "server_deadline_met_rate": sum(1 for r in results if r.deadline_met) / len(results),
            # where a turn's time went: the server's stages, from the caller's last voiced frame
            "waterfall": waterfall_figures(results)}


async def until(condition: Callable[[], bool], tasks: list[asyncio.Task]) -> None:
    """Wait for `condition()`, raising at once if a task has failed instead."""
    while True:
        for task in tasks:
            if task.done():
                task.result()
        if condition():
            return
        await asyncio.sleep(0.1)


async def run_policy(runtime: Runtime, load: ApiLoad, calls: int, turns: int, questions: list[np.ndarray],
                     call_config: CallConfig) -> dict:
    """The API streams run throughout: until each has finished one request (the engine is full and the
    streams out of step), then `load.alone_s` measured alone, then measured while the callers speak."""
    server = VoiceServer(runtime, Limits(max_calls=calls), call_config=call_config)
    await server.start("127.0.0.1", 0)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    streams: list[list[ApiRequest]] = [[] for _ in range(load.streams)]
    tasks: list[asyncio.Task] = []
    try:
        model = (await client.models.list()).data[0].id
        prompts = api_prompts(runtime.tokenizer, load.streams * PROMPTS_PER_STREAM, load.prompt_tokens)
        tasks = [asyncio.create_task(api_stream(client, model, prompts[i::load.streams], load.max_tokens, mine))
                 for i, mine in enumerate(streams)]
        await until(lambda: all(any(r.tokens is not None for r in mine) for mine in streams), tasks)
        alone_start = time.monotonic()
        steps = StepLog(runtime)
        await until(lambda: time.monotonic() >= alone_start + load.alone_s, tasks)
        steps_alone = steps.take()
        mixed_start = time.monotonic()
        url = f"ws://127.0.0.1:{server.port}/ws"
        per_call = await asyncio.gather(*(caller(url, questions[i:] + questions[:i], turns, 0.37 * i)
                                          for i in range(calls)))
        mixed_end = time.monotonic()
        steps_mixed = steps.take()
        steps.close()
        await until(lambda: True, tasks)  # a stream that failed while the calls ran fails the run
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await server.close()
    requests = [r for mine in streams for r in mine]
    alone = api_figures(requests, alone_start, mixed_start)
    mixed = api_figures(requests, mixed_start, mixed_end)
    figures = {"calls": call_figures([r for call in per_call for r in call], call_config.ttfa_s),
               "api_alone": alone, "api_mixed": mixed,
               "steps_api_alone": step_figures(steps_alone, load.streams),
               "steps_mixed": step_figures(steps_mixed, load.streams),
               "api_throughput_ratio": mixed["tokens_per_s"] / alone["tokens_per_s"]}
    figures["target_met"] = (figures["calls"]["on_time_rate"] >= ON_TIME_TARGET
                             and figures["api_throughput_ratio"] >= API_RATIO_TARGET)
    return figures


async def bench_mixed(load: ApiLoad, calls: int, turns: int, policies: list[str], deadline_s: float | None = None,
                      options: ModelOptions | None = None, engine: str = "process", server_nice: int = 0) -> dict:
    """`engine`: "process" (as `serve` runs it) or "thread" (the engine beside the server, as it once ran);
    `server_nice`: the niceness this process (server and clients) takes once the engine process runs."""
    from voicepipe.backends.tts_piper import PiperTTS

    if server_nice and len(policies) > 1:  # the next policy's engine would inherit it: it cannot be taken back
        raise ValueError("--server-nice measures one policy at a time")
    for client_log in ("httpx", "httpx2"):  # the SDK's HTTP client (one or the other) logs every request
        logging.getLogger(client_log).setLevel(logging.WARNING)
    options = options or ModelOptions()
    questions = spoken_questions(PiperTTS(options.tts_model if options.tts == "piper" else None))
    call_config = CallConfig(ttfa_s=deadline_s) if deadline_s else CallConfig()
    report: dict = {"api_streams": load.streams, "prompt_tokens": load.prompt_tokens,
                    "api_max_tokens": load.max_tokens, "api_alone_s": load.alone_s, "calls": calls,
                    "turns_per_call": turns, "ttfa_deadline_s": call_config.ttfa_s, "engine": engine,
                    "device": options.device, "precision": options.llm_precision,
                    "torch_threads": options.torch_threads, "policies": {}}
    for policy in policies:
        runtime = await bench_runtime(options.under(policy), engine)
        if server_nice:
            os.nice(server_nice)
        try:
            report["policies"][policy] = await run_policy(runtime, load, calls, turns, questions, call_config)
            prompts = [chat_prompt_ids(runtime.tokenizer, [{"role": "user", "content": p}])
                       for p in api_prompts(runtime.tokenizer, load.streams, load.prompt_tokens, seed=1)]
            report["policies"][policy]["steps_quiet"] = await quiet_steps(runtime, prompts, load.max_tokens)
            report["policies"][policy]["server_nice"] = server_nice
            log.info("%s: %s", policy, report["policies"][policy])
        finally:
            await runtime.close()
    return report


def print_mixed(report: dict) -> None:
    print(f"\n{report['calls']} calls x {report['turns_per_call']} turns beside {report['api_streams']} API streams "
          f"(prompts ~{report['prompt_tokens']} tokens, max_tokens {report['api_max_tokens']}); "
          f"turn deadline {report['ttfa_deadline_s']} s")
    print(f"{'policy':8}{'TTFA p50':>10}{'TTFA p95':>10}{'on time':>9}{'server':>8}{'API alone':>11}{'API mixed':>11}"
          f"{'ratio':>7}{'TTFT p50 alone/mixed':>22}{'TTFT p95 alone/mixed':>22}  target")
    for policy, r in report["policies"].items():
        c, a, m = r["calls"], r["api_alone"], r["api_mixed"]
        print(f"{policy:8}{c['ttfa_p50_s']:10.2f}{c['ttfa_p95_s']:10.2f}{c['on_time_rate']:9.0%}"
              f"{c['server_deadline_met_rate']:8.0%}"
              f"{a['tokens_per_s']:11.1f}{m['tokens_per_s']:11.1f}{r['api_throughput_ratio']:7.2f}"
              f"{a['ttft_p50_s']:14.2f} / {m['ttft_p50_s']:5.2f}{a['ttft_p95_s']:14.2f} / {m['ttft_p95_s']:5.2f}"
              f"  {'met' if r['target_met'] else 'missed'}")
    print("TTFA: the calls' time to first audio (s) from the last speech sample; on time: the server met the "
          "deadline (from the caller's last voiced frame) and the caller heard audio within it; server: the "
          "server met it; API: tokens/s; TTFT: s, of the requests sent within the phase (nan where none of them "
          "had its first token before the streams stopped)")
    for policy, r in report["policies"].items():
        print(f"{policy:8} {r['calls']['within_1_5_s']:.0%} of turns within 1.5 s;", end="")
        print_waterfall(r["calls"]["waterfall"], indent=" ")
    print(f"\nmodel steps (engine: {report['engine']}), p50 ms of the decode steps shaped like the API's "
          f"(p50 / p95 of all steps):")
    for policy, r in report["policies"].items():
        quiet, alone, mixed = r["steps_quiet"], r["steps_api_alone"], r["steps_mixed"]
        ratio = mixed["api_decode_p50_ms"] / quiet["api_decode_p50_ms"] if quiet["api_decode_p50_ms"] else float("nan")
        print(f"{policy:8} quiet {quiet['api_decode_p50_ms']:7.1f}  API alone {alone['api_decode_p50_ms']:7.1f} "
              f"({alone['p50_ms']:.0f} / {alone['p95_ms']:.0f})   mixed {mixed['api_decode_p50_ms']:7.1f} "
              f"({mixed['p50_ms']:.0f} / {mixed['p95_ms']:.0f})   mixed/quiet {ratio:.2f}")
