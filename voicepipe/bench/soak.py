"""`voicepipe bench soak --minutes N`: everything at once for N minutes, against one server with its engine
in its own process (as `serve` runs it): voice calls that hang up and call again, text streams, tool
calls, structured outputs, hostile clients (bodies too deep or too large, wrong methods, a Realtime client
piling up thousands of items) and hostile schemas (past the limits, or within them and past the compile
budget), beside probes of /health and of a short chat request.

Reported: what the server and the engine hold at the start and at the end (resident memory, open files,
threads, KV pages, requests, asyncio tasks: a leak shows as growth), and per window of the run the
calls' on-time rate, the probes' latency, the server's event-loop lag and how every kind of request was
answered. The bench's clients run on the server's event loop, as `bench mixed`'s do: the loop lag counts
their work too, so it is an upper bound on what the server's own work costs."""

import asyncio
import logging
import os
import time
from collections.abc import Callable
from functools import partial

import openai

from voicepipe.backends.loading import ModelOptions
from voicepipe.bench import soak_load as load
from voicepipe.bench.calls import bench_runtime, spoken_questions
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.mixed import call_figures
from voicepipe.bench.process_figures import children, process_figures
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.pipeline import CallConfig
from voicepipe.server import VoiceServer

log = logging.getLogger(__name__)
WARM_S = 60.0  # what is held after the first minute, under load: "flat" compares the end with it
QUIET_S = 15.0  # the chat probe alone first: what "within 2x of quiet" compares with
TARGETS = {"health_p99_s": 0.1, "loop_lag_max_s": 0.05, "hostile_answer_max_s": load.HOSTILE_ANSWER_S,
           "probe_ratio_p50": 2.0}


async def holdings(server: VoiceServer, runtime: Runtime) -> dict:
    """What the server process and the engine process (and its grammar worker) hold now."""
    engine_pid = runtime.engine.pid
    held = await runtime.engine.holdings()
    return {"server": process_figures(os.getpid()), "engine": process_figures(engine_pid),
            "grammar_workers": [process_figures(pid) for pid in children(engine_pid)],
            "kv_used_pages": held["used_pages"], "kv_cached_pages": held["cached_pages"],
            "kv_pinned_pages": sum(held["pinned"].values()), "engine_requests": held["requests"],
            "compiling": held["compiling"], "asyncio_tasks": len(asyncio.all_tasks()), "calls": len(server.calls)}


def window(tally: load.Tally, start: float, end: float, lag_s: float, deadline_s: float) -> dict:
    """The figures of one stretch of the run."""
    records = [r for r in tally.records if start <= r.at < end]
    turns = [turn for at, turn in tally.turns if start <= at < end]
    health = [r.seconds for r in records if r.kind == "probe:health"]
    kinds = sorted({r.kind for r in records})
    return {"from_s": start, "to_s": end, "loop_lag_max_s": lag_s,
            "calls": call_figures(turns, deadline_s) if turns else {"turns": 0},
            "health_p50_s": percentile(health, 50), "health_p99_s": percentile(health, 99),
            "health_max_s": max(health, default=float("nan")),
            "chat_probe_p50_s": percentile([r.seconds for r in records if r.kind == "probe:chat"], 50),
            "answered": {k: {"ok": sum(r.ok for r in records if r.kind == k),
                             "failed": sum(not r.ok for r in records if r.kind == k),
                             "max_s": max(r.seconds for r in records if r.kind == k)} for k in kinds}}


async def probe_beside(client: openai.AsyncOpenAI, seconds: float, *others: Callable) -> tuple[list[float], dict]:
    """The chat probe's latencies for `seconds` beside the `others` loops (nothing else running, when there
    are none), and how the others' requests were answered."""
    tally, stop = load.Tally(), asyncio.Event()
    tasks = [asyncio.create_task(loop(stop, tally)) for loop in (partial(load.chat_probe, client), *others)]
    began = time.monotonic()
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return [r.seconds for r in tally.records if r.kind == "probe:chat" and r.ok], \
        window(tally, began, time.monotonic(), float("nan"), 0.0)["answered"]


async def bench_soak(minutes: float, calls: int = 1, streams: int = 2, items: int = 3000,
                     options: ModelOptions | None = None, window_s: float = 30.0) -> dict:
    from voicepipe.backends.tts_piper import PiperTTS

    for client_log in ("httpx", "httpx2"):
        logging.getLogger(client_log).setLevel(logging.WARNING)
    options = options or ModelOptions()
    questions = spoken_questions(PiperTTS(options.tts_model if options.tts == "piper" else None))
    config = CallConfig()
    limits = Limits(max_calls=calls + 2)
    runtime = await bench_runtime(options, "process")
    server = VoiceServer(runtime, limits, call_config=config)
    await server.start("127.0.0.1", 0)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    url, port = f"ws://127.0.0.1:{server.port}/ws", server.port
    try:
        at_start = await holdings(server, runtime)
        quiet, _ = await probe_beside(client, QUIET_S)
        # Only the hostile requests, the probe beside them: what "within 2x of quiet" asks of them.
        beside_hostile, hostile_alone = await probe_beside(
            client, QUIET_S, partial(load.hostile_http, port, limits.max_body_bytes))
        tally, stop = load.Tally(), asyncio.Event()
        loops = [*(load.calls(url, questions[i:] + questions[:i], stop, tally, 0.37 * i) for i in range(calls)),
                 *(load.text_stream(client, stop, tally) for _ in range(streams)),
                 load.tool_calls(client, stop, tally), load.structured(client, stop, tally),
                 load.hostile_http(port, limits.max_body_bytes, stop, tally),
                 load.hostile_realtime(port, items, stop, tally),
                 load.health(port, stop, tally), load.chat_probe(client, stop, tally)]
        tasks = [asyncio.create_task(loop) for loop in loops]
        began, windows, at_warm = time.monotonic(), [], None
        server.loop_lag.take_worst()
        while time.monotonic() < began + minutes * 60:
            start = time.monotonic()
            await asyncio.sleep(min(window_s, began + minutes * 60 - start))
            windows.append(window(tally, start, time.monotonic(), server.loop_lag.take_worst(), config.ttfa_s))
            windows[-1].update(from_s=start - began, to_s=time.monotonic() - began)
            if at_warm is None and time.monotonic() - began >= WARM_S:
                at_warm = await holdings(server, runtime)
            log.info("soak window: %s", windows[-1])
        stop.set()
        done, late = await asyncio.wait(tasks, timeout=120)
        for task in late:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                log.error("a soak client failed: %r", task.exception())
        await asyncio.sleep(2.0)  # calls and streams wind down; cached pages stay, as they should
        at_end = await holdings(server, runtime)
    finally:
        await client.close()
        await server.close()
        await runtime.close()
    whole = window(tally, began, began + minutes * 60 + 1e9, max(w["loop_lag_max_s"] for w in windows),
                   config.ttfa_s)
    probe = [r.seconds for r in tally.records if r.kind == "probe:chat" and r.ok]
    # A reply to 3,000 items is a valid request whose prompt takes its seconds to prefill: it is reported
    # beside the others, not held to the time a refusal must take.
    hostile = [r.seconds for r in tally.records if r.kind.startswith("hostile:") and r.kind != "hostile:many_items"]
    summary = {"health_p99_s": whole["health_p99_s"], "loop_lag_max_s": whole["loop_lag_max_s"],
               "hostile_answer_max_s": max(hostile, default=float("nan")),
               "probe_quiet_p50_s": percentile(quiet, 50), "probe_beside_hostile_p50_s": percentile(beside_hostile, 50),
               "probe_ratio_p50": percentile(beside_hostile, 50) / percentile(quiet, 50),
               "probe_soak_p50_s": percentile(probe, 50), "probe_soak_ratio_p50": percentile(probe, 50) /
               percentile(quiet, 50)}
    summary["targets_met"] = {name: summary[name] <= bound for name, bound in TARGETS.items()}
    return {"minutes": minutes, "calls": calls, "streams": streams, "items": items, "engine": "process",
            "at_start": at_start, "at_warm": at_warm or at_end, "at_end": at_end, "hostile_alone": hostile_alone,
            "windows": windows,
            "whole": whole, "summary": summary, "targets": TARGETS,
            "failures": [{"kind": r.kind, "seconds": r.seconds, "detail": r.detail} for r in tally.records
                         if not r.ok][:100]}


def print_soak(report: dict) -> None:
    start, warm, end = report["at_start"], report["at_warm"], report["at_end"]
    print(f"\nsoak: {report['minutes']:g} min, {report['calls']} calls, {report['streams']} text streams, tool "
          f"calls, structured outputs, hostile clients and schemas, a Realtime client of {report['items']} items")
    print(f"{'held':26}{'start':>14}{'after 1 min':>14}{'end':>14}")
    figures = {"server RSS MiB": lambda h: h["server"]["rss_bytes"] / 2**20,
               "engine RSS MiB": lambda h: h["engine"]["rss_bytes"] / 2**20,
               "server open files": lambda h: h["server"]["open_files"],
               "engine open files": lambda h: h["engine"]["open_files"],
               "grammar workers": lambda h: len(h["grammar_workers"]),
               "KV used / cached pages": lambda h: f"{h['kv_used_pages']}/{h['kv_cached_pages']}",
               "KV pinned pages": lambda h: h["kv_pinned_pages"], "engine requests": lambda h: h["engine_requests"],
               "asyncio tasks": lambda h: h["asyncio_tasks"]}
    for name, figure in figures.items():
        values = [figure(held) for held in (start, warm, end)]
        print(f"{name:26}" + "".join(f"{v:>14.1f}" if isinstance(v, float) else f"{v!s:>14}" for v in values))
    print(f"\n{'window s':>12}{'turns':>7}{'on time':>9}{'health p99':>12}{'loop lag':>10}{'chat p50':>10}"
          f"{'hostile max':>13}")
    for w in report["windows"]:
        hostile = max((v["max_s"] for k, v in w["answered"].items() if k.startswith("hostile:")), default=float("nan"))
        rate = w["calls"].get("on_time_rate")
        print(f"{w['from_s']:5.0f}-{w['to_s']:<6.0f}{w['calls']['turns']:7d}"
              f"{(f'{rate:.0%}' if rate is not None else '-'):>9}{w['health_p99_s'] * 1000:10.1f}ms"
              f"{w['loop_lag_max_s'] * 1000:8.1f}ms{w['chat_probe_p50_s']:9.2f}s{hostile:12.2f}s")
    print("\nanswered, whole run (ok / failed, slowest):")
    for kind, v in report["whole"]["answered"].items():
        print(f"  {kind:28}{v['ok']:6d} / {v['failed']:<4d}{v['max_s']:8.2f} s")
    s = report["summary"]
    print(f"\n/health p99 {s['health_p99_s'] * 1000:.1f} ms, event-loop lag max {s['loop_lag_max_s'] * 1000:.1f} ms, "
          f"hostile requests answered within {s['hostile_answer_max_s']:.2f} s (the reply to many items aside); "
          f"chat probe p50 {s['probe_quiet_p50_s']:.2f} s quiet, {s['probe_beside_hostile_p50_s']:.2f} s beside "
          f"the hostile requests alone (x{s['probe_ratio_p50']:.2f}), {s['probe_soak_p50_s']:.2f} s in the whole "
          f"soak (x{s['probe_soak_ratio_p50']:.2f})")
    print("targets: " + ", ".join(f"{k} {'met' if v else 'missed'}" for k, v in s["targets_met"].items()))
