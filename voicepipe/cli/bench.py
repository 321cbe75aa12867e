"""The `voicepipe bench` command: `bench engine` (modes, roofline, knob sweep); `bench calls` (real calls);
`bench mixed` (calls beside API traffic); `bench turns` (turn-taking); `bench grammar` (constrained
decoding)."""

import argparse
import json
import logging
import platform
import time
from pathlib import Path

from voicepipe.bench.engine_setup import add_engine_setup_arguments
from voicepipe.bench.workload import Workload
from voicepipe.cli.options import add_llm_model_arguments, add_verbose_argument

log = logging.getLogger(__name__)
MODES = ("static", "fcfs", "o4", "hf_static", "hf_cb")
WORKLOADS = ("mixed", "poisson", "all_at_once")
COLUMNS = ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_argument(parser)
    parser.add_argument("--plot", metavar="FILE.png", help="draw the results")
    parser.add_argument("--quick", action="store_true", help="a small workload (minutes, not tens of minutes)")
    parser.add_argument("--sweep", action="store_true", help="sweep max_batch_tokens x max_batch_seqs instead")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    add_llm_model_arguments(parser)
    parser.add_argument("--max-batch-tokens", type=int, help="tokens per step (default: the engine's)")
    parser.add_argument("--max-batch-seqs", type=int, help="sequences per step (default: the engine's)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)} (mixed always runs)")
    parser.add_argument("--precisions", metavar="LIST",
                        help="comma-separated weight precisions (e.g. fp32,int8,int4), each measured in this run: "
                             "batch-1 and batch-16 decode against the bandwidth limit, and all-at-once "
                             "throughput against transformers' generate in static batches of 32")
    add_engine_setup_arguments(parser)


def add_calls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=4, metavar="N", help="the most simultaneous callers to try")
    add_caller_arguments(parser, turns=2)


def add_caller_arguments(parser: argparse.ArgumentParser, turns: int) -> None:
    """Options of the benches with simulated callers (`calls`, `mixed`)."""
    parser.add_argument("--turns", type=int, default=turns, help=f"questions each caller asks (default {turns})")
    parser.add_argument("--policies", default="o4,fcfs", help="comma-separated: o4, fcfs")
    parser.add_argument("--deadline", type=float, metavar="S",
                        help="time-to-first-audio deadline of each turn (default: the server's, 1.5 s)")
    add_json_argument(parser)
    parser.add_argument("--engine", choices=("process", "thread"), default="process",
                        help="where the engine runs: its own process (as serve runs it, default) or a thread of "
                             "the server's process (to see what the interpreter lock costs)")
    parser.add_argument("--torch-threads", type=int, metavar="N", help="torch's threads in the engine process")
    add_llm_model_arguments(parser)


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


def add_threads_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.threads import POLICIES

    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of "
                        + ",".join(POLICIES))
    add_json_argument(parser)


def add_ipc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="tiny", help="random-weight model shape (default tiny: the channel's "
                                                        "cost shows; 'default' is SmolLM2-135M's)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent requests (default 8)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each (default 64)")
    add_json_argument(parser)


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")


def save(report: dict, path: str) -> None:
    Path(path).write_text(json.dumps(report, indent=2))


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    add_llm_model_arguments(parser)
    parser.add_argument("--batches", default="1,16", help="comma-separated decode batch sizes (default 1,16)")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens before the decodes (default 64)")
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own, one per core)")
    add_json_argument(parser)


def run_decode_bench(args: argparse.Namespace) -> int:
    import torch

    from voicepipe.bench.decode_profile import print_profile, profile_decode
    from voicepipe.bench.engine_setup import engine_settings
    from voicepipe.models import load_llm

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
    from voicepipe.bench.threads import bench_threads, print_threads
    from voicepipe.threads import POLICIES

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

    from voicepipe.bench.calls import bench_calls
    from voicepipe.loading import ModelOptions

    report = asyncio.run(bench_calls(args.calls, args.turns, args.policies.split(","), args.deadline,
                                     ModelOptions.pick(vars(args)), args.engine))
    report["machine"] = machine()
    for policy, result in report["policies"].items():
        print(f"\n{policy}: holds {result['max_calls_within_deadline']} calls with >= 95% of turns on time")
        for level in result["levels"]:
            print(f"  {level['calls']} calls: time to first audio (from the last speech sample) p50 "
                  f"{level['ttfa_p50_s']:.2f} s, p95 {level['ttfa_p95_s']:.2f} s, p99 {level['ttfa_p99_s']:.2f} s, "
                  f"on time {level['deadline_hit_rate']:.0%}, "
                  f"underruns {level['underruns']}")
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

    from voicepipe.bench.turns import bench_turns, print_turns
    from voicepipe.loading import ModelOptions

    report = asyncio.run(bench_turns(ModelOptions.pick(vars(args)), args.questions, tuple(args.voices.split(",")),
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

    from voicepipe.bench.mixed import bench_mixed, print_mixed
    from voicepipe.bench.workload import ApiLoad
    from voicepipe.loading import ModelOptions

    load = ApiLoad(args.streams, args.prompt_tokens, args.api_max_tokens, args.alone)
    report = asyncio.run(bench_mixed(load, args.calls, args.turns, args.policies.split(","), args.deadline,
                                     ModelOptions.pick(vars(args)), args.engine, args.server_nice))
    report["machine"] = machine()
    print_mixed(report)
    if args.json:
        save(report, args.json)
    return 0


def machine(device: str = "cpu") -> dict:
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "device": device}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def workloads(quick: bool) -> dict[str, Workload]:
    """The mixed burst (output lengths vary), the same requests under Poisson arrivals, and an all-at-once
    batch of equal outputs, the case plain static `generate` is best at."""
    if quick:
        return {"mixed": Workload(requests=12, prompt_tokens=(32, 128), output_tokens=(8, 48)),
                "poisson": Workload(12, (32, 128), (8, 48), poisson_rate=2.0),
                "all_at_once": Workload(12, (32, 128), (24, 24))}
    return {"mixed": Workload(), "poisson": Workload(poisson_rate=0.5),
            "all_at_once": Workload(32, (32, 256), (64, 64))}


def compare_modes(model, tokenizer, workload: Workload, modes: list[str], settings: dict) -> dict:
    """Each mode on the workload; `settings` are the engine's (the knobs, the precision)."""
    from scheduler import EngineConfig
    from voicepipe.bench.engine_modes import run_engine, run_hf_continuous_batching, run_hf_static
    from voicepipe.bench.engine_setup import items_for, release_device_memory

    items = items_for(workload, tokenizer)
    results = {}
    for mode in modes:
        release_device_memory()
        log.info("running %s on %d requests", mode, len(items))
        if mode == "hf_static":
            results[mode] = run_hf_static(model, tokenizer, items)
        elif mode == "hf_cb":
            try:
                results[mode] = run_hf_continuous_batching(model, items)
            except Exception as exc:  # an optional peer: report why it could not run
                results[mode] = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            results[mode] = run_engine(model, tokenizer, items, EngineConfig(policy=mode, **settings))
    return results


def sweep(model, tokenizer, quick: bool, settings: dict) -> list[dict]:
    """Each (max_batch_tokens, max_batch_seqs) of a grid; `settings` are the engine's other fields."""
    from scheduler import EngineConfig
    from voicepipe.bench.engine_modes import run_engine
    from voicepipe.bench.engine_setup import items_for, release_device_memory

    workload = Workload(requests=8 if quick else 24, prompt_tokens=(32, 128 if quick else 256),
                        output_tokens=(8, 24 if quick else 64))
    items = items_for(workload, tokenizer)
    tokens_grid = (64, 256) if quick else (32, 64, 128, 256, 512)
    seqs_grid = (2, 8) if quick else (2, 4, 8, 16, 32)
    rows = []
    for max_batch_tokens in tokens_grid:
        for max_batch_seqs in seqs_grid:
            release_device_memory()
            result = run_engine(model, tokenizer, items, EngineConfig(max_batch_tokens=max_batch_tokens,
                                                                      max_batch_seqs=max_batch_seqs, **settings))
            rows.append({"max_batch_tokens": max_batch_tokens, "max_batch_seqs": max_batch_seqs, **result})
            log.info("tokens=%d seqs=%d: %.1f tok/s", max_batch_tokens, max_batch_seqs, result["throughput_tok_s"])
    return rows


def print_table(title: str, modes: dict) -> None:
    print(f"\n{title}")
    print(f"{'mode':10}" + "".join(f"{c:>18}" for c in COLUMNS))
    for mode, m in modes.items():
        cells = [f"{m[c]:18.2f}" if c in m else f"{'-':>18}" for c in COLUMNS]
        print(f"{mode:10}" + "".join(cells) + (f"  ({m['error']})" if "error" in m else ""))


def run_engine_bench(args: argparse.Namespace) -> int:
    from scheduler import EngineConfig
    from voicepipe.bench.engine_modes import decode_roofline
    from voicepipe.bench.engine_setup import engine_settings, load_bench_model, roofline_prompt

    engine = engine_settings(args)  # before loading: a device that cannot run the precision fails at once
    model, tokenizer = load_bench_model(args, engine)
    defaults = EngineConfig()
    knobs = {"max_batch_tokens": args.max_batch_tokens or defaults.max_batch_tokens,
             "max_batch_seqs": args.max_batch_seqs or defaults.max_batch_seqs}
    report: dict = {"machine": machine(engine["device"]), "knobs": knobs, "precision": engine["precision"],
                    "engine": engine, "model": args.random_weights and f"random weights, shape {args.random_weights}",
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    settings = {**knobs, **engine}
    if args.sweep:
        report["sweep"] = sweep(model, tokenizer, args.quick, engine)
        for row in report["sweep"]:
            print(f"max_batch_tokens={row['max_batch_tokens']:4d} max_batch_seqs={row['max_batch_seqs']:3d} "
                  f"{row['throughput_tok_s']:8.1f} tok/s  p99 latency {row['latency_p99_s']:6.2f} s")
    else:
        modes = [m for m in args.modes.split(",") if m]
        unknown = set(modes) - set(MODES)
        if unknown:
            raise SystemExit(f"voicepipe: error: unknown modes {', '.join(sorted(unknown))}")
        chosen = [w for w in args.workloads.split(",") if w]
        unknown = set(chosen) - set(WORKLOADS)
        if unknown:
            raise SystemExit(f"voicepipe: error: unknown workloads {', '.join(sorted(unknown))}")
        loads = workloads(args.quick)
        report["workload"] = loads["mixed"].describe()
        report["modes"] = compare_modes(model, tokenizer, loads["mixed"], modes, settings)
        print_table("mixed: all requests at once, output lengths vary", report["modes"])
        for name, title in (("poisson", f"Poisson arrivals, {loads['poisson'].poisson_rate}/s"),
                            ("all_at_once", "all at once, equal output lengths")):
            if name not in chosen:
                continue
            report[name] = {"workload": loads[name].describe(),
                            "modes": compare_modes(model, tokenizer, loads[name], modes, settings)}
            print_table(title, report[name]["modes"])
        report["roofline"] = decode_roofline(model, tokenizer, engine["precision"],
                                             prompt_ids=roofline_prompt(tokenizer),
                                             settings={"device": engine["device"], "kv_dtype": engine["kv_dtype"]})
        r = report["roofline"]
        print(f"\nbatch-1 decode {r['batch1_decode_tok_s']:.1f} tok/s; bandwidth limit {r['limit_tok_s']:.1f} tok/s "
              f"({r['bandwidth_gb_s']:.1f} GB/s over {r['weight_bytes'] / 1e6:.0f} MB of weights): "
              f"{r['ratio_of_limit']:.2f} of the limit; batch-16 decode {r['batch16_decode_tok_s']:.1f} tok/s: "
              f"{r['batch16_ratio_of_limit']:.2f} of its limit")
        if args.precisions:
            hf = report.get("all_at_once", {}).get("modes", {}).get("hf_static")
            report["precisions"] = compare_precisions(model, tokenizer, args.precisions.split(","), settings,
                                                      loads["all_at_once"], hf)
            print_precisions(report["precisions"])
        ratios = ratios_of(report["modes"])
        if "all_at_once" in report:
            ratios.update({f"all_at_once_{k}": v for k, v in ratios_of(report["all_at_once"]["modes"]).items()})
        report["ratios"] = ratios
        for name, value in ratios.items():
            print(f"{name}: {value:.2f}")
    if args.json:
        save(report, args.json)
    if args.plot:
        from voicepipe.bench.plots import plot_report

        plot_report(report, args.plot)
    return 0


def compare_precisions(model, tokenizer, precisions: list[str], settings: dict, load: Workload,
                       hf_static: dict | None) -> dict:
    """For each precision: decode at batch 1 and 16 against the bandwidth limit, and all-at-once throughput
    (W, o4) against transformers' `generate` in static batches of 32 (`hf_static`, run here if not given)."""
    from scheduler import EngineConfig
    from scheduler.device import check_precision, resolve_device
    from voicepipe.bench.engine_modes import decode_roofline, run_engine, run_hf_static
    from voicepipe.bench.engine_setup import items_for, release_device_memory, roofline_prompt

    for precision in precisions:  # all checked before anything runs
        check_precision(resolve_device(settings["device"]), precision)
    items = items_for(load, tokenizer)
    hf = (hf_static or run_hf_static(model, tokenizer, items, batch_size=32))["throughput_tok_s"]
    rows = {}
    for precision in precisions:
        release_device_memory()
        roof = decode_roofline(model, tokenizer, precision, prompt_ids=roofline_prompt(tokenizer),
                               settings={"device": settings["device"], "kv_dtype": settings["kv_dtype"]})
        w = run_engine(model, tokenizer, items, EngineConfig(**{**settings, "policy": "o4", "precision": precision}))
        rows[precision] = {**roof, "all_at_once_tok_s": w["throughput_tok_s"],
                           "all_at_once_vs_hf_static_32": w["throughput_tok_s"] / hf}
    return {"workload": load.describe(), "hf_static_32_tok_s": hf, "by_precision": rows}


def print_precisions(table: dict) -> None:
    print(f"\nprecisions, this run (generate static-32, all at once: {table['hf_static_32_tok_s']:.1f} tok/s)")
    print(f"{'precision':10}{'MB/step':>9}{'limit tok/s':>12}{'batch 1':>9}{'of limit':>9}{'batch 16':>10}"
          f"{'of limit':>9}{'W tok/s':>9}{'W/generate':>11}")
    for precision, r in table["by_precision"].items():
        print(f"{precision:10}{r['weight_bytes'] / 1e6:9.0f}{r['limit_tok_s']:12.1f}{r['batch1_decode_tok_s']:9.1f}"
              f"{r['ratio_of_limit']:9.2f}{r['batch16_decode_tok_s']:10.1f}{r['batch16_ratio_of_limit']:9.2f}"
              f"{r['all_at_once_tok_s']:9.1f}{r['all_at_once_vs_hf_static_32']:11.2f}")


def ratios_of(modes: dict) -> dict:
    out = {}
    o4 = modes.get("o4", {})
    for peer in ("static", "fcfs", "hf_static", "hf_cb"):
        m = modes.get(peer, {})
        if "throughput_tok_s" in o4 and "throughput_tok_s" in m:
            out[f"o4_vs_{peer}_throughput"] = o4["throughput_tok_s"] / m["throughput_tok_s"]
            out[f"o4_vs_{peer}_latency_p99"] = o4["latency_p99_s"] / m["latency_p99_s"]
    return out


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_subparsers(dest="bench", required=True, metavar="WHAT")
    benches = [
        (add_engine_arguments, "engine", "one LLM workload through static, fcfs, o4, hf_static, hf_cb"),
        (add_calls_arguments, "calls", "simulated callers over the websocket, o4 vs fcfs"),
        (add_mixed_arguments, "mixed", "voice calls beside streams of /v1/chat/completions, o4 vs fcfs"),
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
    ]
    for add_arguments, name, description in benches:
        sub = which.add_parser(name, help=description)
        add_verbose_argument(sub)
        add_arguments(sub)


def run_bench(args: argparse.Namespace) -> int:
    runs = {"engine": run_engine_bench, "calls": run_calls_bench, "mixed": run_mixed_bench,
            "threads": run_threads_bench, "ipc": run_ipc_bench, "convoy": run_convoy_bench,
            "turns": run_turns_bench, "grammar": run_grammar_bench, "decode": run_decode_bench}
    return runs[args.bench](args)
