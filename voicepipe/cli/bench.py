"""The `voicepipe bench` command: `bench engine` (modes, roofline, knob sweep); `bench calls` (real calls);
`bench mixed` (calls beside API traffic); `bench turns` (turn-taking); `bench grammar` (constrained
decoding); `bench soak` (everything at once, hostile clients too, for N minutes)."""

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler.policies import call_policies
from voicepipe.backends.arguments import add_llm_model_arguments
from voicepipe.bench.engine_command import MODES, add_engine_arguments, run_engine_bench
from voicepipe.bench.report import add_json_argument, machine, save
from voicepipe.cli.options import add_verbose_argument

if TYPE_CHECKING:  # the runtime imports torch
    from voicepipe.call.runtime import Runtime


def add_calls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=4, metavar="N", help="the most simultaneous callers to try")
    parser.add_argument("--from-calls", type=int, default=1, metavar="N",
                        help="the fewest to try (default 1; a policy then holds at least N - 1, unmeasured)")
    add_caller_arguments(parser, turns=2)


def add_caller_arguments(parser: argparse.ArgumentParser, turns: int) -> None:
    """Options of the benches with simulated callers (`calls`, `mixed`)."""
    parser.add_argument("--turns", type=int, default=turns, help=f"questions each caller asks (default {turns})")
    parser.add_argument("--policies", default=",".join(call_policies()),
                        help=f"comma-separated: {', '.join(call_policies())}")
    parser.add_argument("--deadline", type=float, metavar="S",
                        help="time-to-first-audio deadline of each turn (default: the server's, 1.5 s)")
    add_json_argument(parser)
    parser.add_argument("--engine", choices=("process", "thread"), default="process",
                        help="where the engine runs: its own process (as serve runs it, default) or a thread of "
                             "the server's process (to see what the interpreter lock costs)")
    parser.add_argument("--torch-threads", type=int, metavar="N", help="torch's threads in the engine process")
    parser.add_argument("--engine-field", dest="engine_fields", action=EngineField, default={}, metavar="NAME=N",
                        help="an engine setting for this run (repeatable), e.g. expect_background_seqs=4")
    add_llm_model_arguments(parser)


class EngineField(argparse.Action):
    """`--engine-field NAME=N`: one numeric EngineConfig field, checked by name, gathered into a dict."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        from scheduler import EngineConfig

        name, _, number = value.partition("=")
        if name not in EngineConfig.__dataclass_fields__:
            parser.error(f"--engine-field: EngineConfig has no field {name!r}")
        try:
            parsed = float(number) if "." in number else int(number)
        except ValueError:
            parser.error(f"--engine-field {name}: {number!r} is not a number")
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), name: parsed})


def add_mixed_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.bench.workload import ApiLoad

    d = ApiLoad()
    parser.add_argument("--streams", type=int, default=d.streams, metavar="M",
                        help=f"concurrent /v1/chat/completions streams (default {d.streams})")
    parser.add_argument("--calls", type=int, default=2, metavar="K", help="simultaneous voice calls (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens,
                        help=f"tokens of each API prompt (default {d.prompt_tokens})")
    parser.add_argument("--api-max-tokens", type=int, default=d.max_tokens,
                        help=f"max_tokens of each API request (default {d.max_tokens})")
    parser.add_argument("--alone", type=float, default=d.alone_s, metavar="S",
                        help=f"seconds API throughput is measured without calls (default {d.alone_s:g})")
    add_caller_arguments(parser, turns=10)
    parser.add_argument("--server-nice", type=int, default=0, metavar="N",
                        help="niceness the server process (and the bench's clients) takes once the engine process "
                             "runs, so the engine wins the cores (default 0)")


def add_soak_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, metavar="N", help="how long to run (default 10)")
    parser.add_argument("--calls", type=int, default=1, metavar="K", help="voice calls, calling again and again "
                        "(default 1)")
    parser.add_argument("--streams", type=int, default=2, metavar="M", help="text streams (default 2)")
    parser.add_argument("--items", type=int, default=3000, help="conversation items the hostile Realtime client "
                        "sends before each reply (default 3000)")
    add_json_argument(parser)
    add_llm_model_arguments(parser)


def run_soak_bench(args: argparse.Namespace) -> int:
    import asyncio

    from voicepipe.backends.arguments import model_options
    from voicepipe.bench.soak import bench_soak, print_soak

    report = asyncio.run(bench_soak(args.minutes, args.calls, args.streams, args.items, model_options(args)))
    report["machine"] = machine()
    print_soak(report)
    if args.json:
        save(report, args.json)
    return 0


def add_threads_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.backends.threads import POLICIES

    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of "
                        + ",".join(POLICIES))
    add_json_argument(parser)


def add_ipc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="tiny", help="random-weight model shape (default tiny: the channel's "
                                                        "cost shows; 'default' is SmolLM2-135M's)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent requests (default 8)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each (default 64)")
    add_json_argument(parser)


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    add_llm_model_arguments(parser)
    parser.add_argument("--batches", default="1,16", help="comma-separated decode batch sizes (default 1,16)")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens before the decodes (default 64)")
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own, one per core)")
    add_json_argument(parser)


def run_decode_bench(args: argparse.Namespace) -> int:
    import torch

    from voicepipe.backends.models import load_llm
    from voicepipe.bench.decode_profile import print_profile, profile_decode
    from voicepipe.bench.engine_setup import engine_settings

    args.kv_dtype, args.kv_gib, args.static_batch_size = "auto", None, None
    precision = engine_settings(args)["precision"]
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_llm(args.llm_model)
    report = {"machine": machine(), "profiles": []}
    for batch in (int(b) for b in args.batches.split(",") if b):
        result = profile_decode(model, tokenizer, precision, batch, args.context)
        print_profile(result)
        report["profiles"].append(result)
    if args.json:
        save(report, args.json)
    return 0


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, help="recordings of calls (`serve --record-front-end`, `bench room "
                        "--record`)")
    add_json_argument(parser)


def run_replay_bench(args: argparse.Namespace) -> int:
    from voicepipe.bench.replay import print_replay, replay_folder

    if not args.folder.is_dir():
        print(f"voicepipe: {args.folder} is not a folder", file=sys.stderr)
        return 2
    report = replay_folder(args.folder)
    print_replay(report)
    if args.json:
        save(report, args.json)
    return 0


def run_convoy_bench(args: argparse.Namespace) -> int:
    import asyncio

    from voicepipe.bench.convoy import bench_convoy, print_convoy

    report = {"machine": machine(), **asyncio.run(bench_convoy())}
    print_convoy(report)
    if args.json:
        save(report, args.json)
    return 0


def run_ipc_bench(args: argparse.Namespace) -> int:
    import asyncio

    from voicepipe.bench.ipc import bench_ipc, print_ipc

    report = {"machine": machine(), **asyncio.run(bench_ipc(args.shape, args.streams, args.tokens))}
    print_ipc(report)
    if args.json:
        save(report, args.json)
    return 0


def run_threads_bench(args: argparse.Namespace) -> int:
    from voicepipe.backends.threads import POLICIES
    from voicepipe.bench.threads import bench_threads, print_threads

    policies = [p for p in args.policies.split(",") if p]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise SystemExit(f"voicepipe: error: unknown policies {', '.join(sorted(unknown))}")
    report = {"machine": machine(), "policies": bench_threads(policies)}
    print_threads(report["policies"])
    if args.json:
        save(report, args.json)
    return 0


def run_calls_bench(args: argparse.Namespace) -> int:
    import asyncio

    from voicepipe.backends.arguments import model_options
    from voicepipe.bench.calls import bench_calls, print_waterfall

    if not 1 <= args.from_calls <= args.calls:
        print("voicepipe: --from-calls must be between 1 and --calls", file=sys.stderr)
        return 2
    report = asyncio.run(bench_calls(args.calls, args.turns, args.policies.split(","), args.deadline,
                                     model_options(args), args.engine, args.from_calls))
    report["machine"] = machine()
    for policy, result in report["policies"].items():
        print(f"\n{policy}: holds {result['max_calls_within_deadline']} calls with >= 95% of turns on time")
        for level in result["levels"]:
            print(f"  {level['calls']} calls: time to first audio (from the last speech sample) p50 "
                  f"{level['ttfa_p50_s']:.2f} s, p95 {level['ttfa_p95_s']:.2f} s, p99 {level['ttfa_p99_s']:.2f} s, "
                  f"on time {level['deadline_hit_rate']:.0%}, "
                  f"underruns {level['underruns']}")
            print_waterfall(level["waterfall"], indent="    ")
    if args.json:
        save(report, args.json)
    return 0


def add_turns_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.bench.turn_set import ESPEAK_VOICES, SPLIT_QUESTIONS

    parser.add_argument("--questions", type=int, default=6, metavar="N",
                        help=f"questions of the set to use (of {len(SPLIT_QUESTIONS)}; default 6)")
    parser.add_argument("--voices", default=",".join((*ESPEAK_VOICES, "piper")),
                        help="comma-separated espeak-ng voices, and piper")
    parser.add_argument("--modes", default="server_vad,semantic_vad", help="turn detection modes to call with")
    parser.add_argument("--decisions-only", action="store_true", help="judge the samples, make no calls")
    add_json_argument(parser)
    add_llm_model_arguments(parser)


def run_turns_bench(args: argparse.Namespace) -> int:
    import asyncio

    from voicepipe.backends.arguments import model_options
    from voicepipe.bench.turns import bench_turns, print_turns

    report = asyncio.run(bench_turns(model_options(args), args.questions, tuple(args.voices.split(",")),
                                     tuple(args.modes.split(",")), args.decisions_only))
    report["machine"] = machine()
    print_turns(report)
    if args.json:
        save(report, args.json)
    return 0


def add_grammar_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1000, metavar="N",
                        help="constrained requests whose outputs are validated (default 1000)")
    parser.add_argument("--share", type=float, default=0.25, help="share of the workload constrained (default 0.25)")
    parser.add_argument("--quick", action="store_true", help="a small workload for the cost")
    add_json_argument(parser)


def run_grammar_bench(args: argparse.Namespace) -> int:
    from voicepipe.bench.grammar import bench_grammar, print_grammar

    report = bench_grammar(args.requests, args.share, args.quick)
    report["machine"] = machine()
    print_grammar(report)
    if args.json:
        save(report, args.json)
    return 0


def run_mixed_bench(args: argparse.Namespace) -> int:
    import asyncio

    from voicepipe.backends.arguments import model_options
    from voicepipe.bench.mixed import bench_mixed, print_mixed
    from voicepipe.bench.workload import ApiLoad

    load = ApiLoad(args.streams, args.prompt_tokens, args.api_max_tokens, args.alone)
    report = asyncio.run(bench_mixed(load, args.calls, args.turns, args.policies.split(","), args.deadline,
                                     model_options(args), args.engine, args.server_nice))
    report["machine"] = machine()
    print_mixed(report)
    if args.json:
        save(report, args.json)
    return 0


def add_room_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.bench.room_cases import CASES

    parser.add_argument("--rooms", default="all", help="comma-separated numbers of the rooms to run, from 1 "
                        "(default all: " + "; ".join(f"{i} {c.name}" for i, c in enumerate(CASES, 1)) + ")")
    parser.add_argument("--tries", type=int, default=20, help="interruptions per room tried through the front "
                        "end and the VAD alone, after the calls (default 20; 0 skips them)")
    parser.add_argument("--calls", type=int, default=1, help="calls per room and front-end setting (default 1); "
                        "their figures are summed, false barge-ins also per 100 replies")
    parser.add_argument("--front", choices=("both", "on", "off"), default="both",
                        help="the calls with the audio front end on, off, or both (default)")
    parser.add_argument("--record", type=Path, metavar="DIR", help="write each call's recording (the server's "
                        "microphone and far end) and script (the caller's) to DIR, for `bench replay`")
    add_json_argument(parser)
    add_llm_model_arguments(parser)


def picked_rooms(rooms: str) -> list:
    """The rooms named by `--rooms`: "all", or their numbers from 1, comma-separated."""
    from voicepipe.bench.room_cases import CASES

    return CASES if rooms == "all" else [CASES[int(i) - 1] for i in rooms.split(",")]


def run_room_bench(args: argparse.Namespace) -> int:
    from voicepipe.backends.arguments import model_options
    from voicepipe.bench.room_bench import bench_room, print_barge_in, print_room, reply_sentences_of

    cases = picked_rooms(args.rooms)
    sentences = reply_sentences_of(model_options(args))

    def show(report: dict) -> None:
        print_room(report)
        if "barge_in" in report:
            print_barge_in(report["barge_in"])

    fronts = {"both": (True, False), "on": (True,), "off": (False,)}[args.front]
    return run_on_spawned(args, lambda runtime: bench_room(runtime, cases, sentences, args.tries, args.calls, fronts,
                                                           args.record), show)


def add_talk_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.bench.room_cases import CASES

    parser.add_argument("--rooms", default="1,2,3,4", help="comma-separated numbers of the rooms, as `bench room` "
                        "numbers them (default 1,2,3,4: " + "; ".join(f"{i} {c.name}" for i, c in
                                                               enumerate(CASES[:4], 1)) + ")")
    parser.add_argument("--off", action="store_true", help="each room again with the call's echo canceller off")
    add_json_argument(parser)
    add_llm_model_arguments(parser)


def run_talk_bench(args: argparse.Namespace) -> int:
    from voicepipe.backends.arguments import model_options
    from voicepipe.bench import sound_server
    from voicepipe.bench.room_bench import print_room, reply_sentences_of
    from voicepipe.bench.talk_room import bench_talk

    if not sound_server.available():
        raise SystemExit("voicepipe bench talk: needs PulseAudio (Debian: pulseaudio pulseaudio-utils "
                         "libasound2-plugins)")
    cases = picked_rooms(args.rooms)
    sentences = reply_sentences_of(model_options(args))

    def show(report: dict) -> None:
        print_room(report)
        for name, runs in report["cases"].items():
            for which, r in runs.items():
                stops = ", ".join("missed" if s is None else f"{s:.2f} s" for s in r["interruption_stop_s"])
                print(f"{name} ({which}): the call heard {r['canceller']}'s output at its end, judged the echo "
                      f"{r['judged_lag_ms']} ms late (the room's own delay {r['room_delay_ms']} ms); "
                      f"interruptions stopped the reply after {stops or '-'}")

    return run_on_spawned(args, lambda runtime: bench_talk(runtime, cases, sentences, args.off), show)


def add_tools_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tries", type=int, default=3, help="questions per tool (default 3)")
    parser.add_argument("--slow-seconds", dest="slow_s", type=float, default=3.0,
                        help="how long the slow tool takes (default 3)")
    add_json_argument(parser)
    add_llm_model_arguments(parser)


def run_tools_bench(args: argparse.Namespace) -> int:
    from voicepipe.backends.tts_piper import PiperTTS
    from voicepipe.bench.tools import bench_tools, print_tools

    return run_on_spawned(args, lambda runtime: bench_tools(runtime, PiperTTS(), args.tries, args.slow_s),
                          print_tools)


def run_on_spawned(args: argparse.Namespace, measure: Callable[["Runtime"], Awaitable[dict]],
                   show: Callable[[dict], None]) -> int:
    """Measure on a runtime with the models in its own engine process, as `serve` runs; print and save."""
    import asyncio

    from voicepipe.backends.arguments import model_options

    options = model_options(args)

    async def run() -> dict:
        from voicepipe.call.runtime import Runtime

        runtime = await Runtime.spawn(options)
        try:
            return await measure(runtime)
        finally:
            await runtime.close()

    report = asyncio.run(run())
    report["machine"] = machine()
    show(report)
    if args.json:
        save(report, args.json)
    return 0


def add_phone_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tries", type=int, default=3, help="rounds of questions on each line (default 3)")
    parser.add_argument("--calls", type=int, default=1, help="calls at once on each line (default 1)")
    add_json_argument(parser)
    add_llm_model_arguments(parser)


def run_phone_bench(args: argparse.Namespace) -> int:
    from voicepipe.backends.tts_piper import PiperTTS
    from voicepipe.bench.phone import bench_phone, print_phone

    return run_on_spawned(args, lambda runtime: bench_phone(runtime, PiperTTS(), args.tries, args.calls),
                          print_phone)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_subparsers(dest="bench", required=True, metavar="WHAT")
    versus = " vs ".join(call_policies())
    benches = [
        (add_engine_arguments, "engine", f"one LLM workload through {', '.join(MODES)}"),
        (add_calls_arguments, "calls", f"simulated callers over the websocket, {versus}"),
        (add_mixed_arguments, "mixed", f"voice calls beside streams of /v1/chat/completions, {versus}"),
        (add_threads_arguments, "threads", "thread-pool policies of torch, CTranslate2 and onnxruntime, each in a "
                                           "fresh process"),
        (add_ipc_arguments, "ipc", "the channel to the engine process against a thread and the bare core"),
        (add_turns_arguments, "turns", "turn-taking on a generated set: end-of-turn decisions, and calls per "
                                       "turn detection mode"),
        (add_grammar_arguments, "grammar", "constrained decoding: outputs validated against their schemas, and "
                                           "its cost beside unconstrained requests"),
        (add_decode_arguments, "decode", "where a decode step's time goes, part by part, at fixed batches"),
        (add_json_argument, "convoy", "the same model steps alone and beside a busy server, the engine on a "
                                      "thread and in its own process"),
        (add_room_arguments, "room", "a speakerphone caller in synthetic rooms (echo, noise), the audio front end "
                                     "on and off"),
        (add_replay_arguments, "replay", "recorded calls run again through the audio front end and the VAD: "
                                         "each utterance, its speech, its barge-in, and whose it was"),
        (add_talk_arguments, "talk", "`talk`'s call on a sound server of its own, its speaker heard by its microphone "
                                     "through synthetic rooms"),
        (add_tools_arguments, "tools", "tools the server runs on the sample MCP server, spoken to in real time: "
                                       "the server's own time per call, a slow tool's filler and answer, a "
                                       "client-run function's, and a question spoken over a slow tool"),
        (add_phone_arguments, "phone", "the same spoken questions from a real SIP phone (baresip) and on the "
                                       "websocket: first audio after the last word on each line"),
        (add_soak_arguments, "soak", "calls, text, tools, structured outputs, hostile clients and schemas together "
                                     "for N minutes: what server and engine hold at start and end, on-time rate"),
    ]
    for add_arguments, name, description in benches:
        sub = which.add_parser(name, help=description)
        add_verbose_argument(sub)
        add_arguments(sub)


def run_bench(args: argparse.Namespace) -> int:
    runs = {"engine": run_engine_bench, "calls": run_calls_bench, "mixed": run_mixed_bench,
            "threads": run_threads_bench, "ipc": run_ipc_bench, "convoy": run_convoy_bench,
            "turns": run_turns_bench, "grammar": run_grammar_bench, "soak": run_soak_bench,
            "decode": run_decode_bench, "room": run_room_bench, "replay": run_replay_bench, "talk": run_talk_bench,
            "tools": run_tools_bench, "phone": run_phone_bench}
    return runs[args.bench](args)
