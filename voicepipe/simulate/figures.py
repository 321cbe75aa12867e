"""The figures a run reports, the same for a simulated engine and a measured one: the benches' throughput and
latency percentiles (`voicepipe.bench.engine_modes.summarize`), time per output token, the share of requests
within a latency objective, the calls' turns on time, and what the steps carried."""

from collections.abc import Iterable

import numpy as np

from scheduler import Sequence
from scheduler.sim import StepShape
from voicepipe.bench.engine_modes import percentile, summarize
from voicepipe.simulate.calls import Call


def shown_tokens(seq: Sequence) -> int:
    """Tokens a request was given (a static batch computes more for members that are done: padding)."""
    return min(len(seq.output_ids), seq.params.max_tokens)


def tpot(seq: Sequence) -> float | None:
    """Time per output token after the first."""
    n = shown_tokens(seq)
    if n < 2 or seq.first_token_at is None or seq.last_token_at is None:
        return None
    return (seq.last_token_at - seq.first_token_at) / (n - 1)


def text_figures(seqs: list[Sequence], start: float, end: float) -> dict:
    """Throughput over [start, end] and latencies of the requests that got that far."""
    done = [s for s in seqs if s.finish_reason is not None]
    ttfts = [s.first_token_at - s.arrival for s in seqs if s.first_token_at is not None]
    e2e = [s.last_token_at - s.arrival for s in done if s.last_token_at is not None]
    tpots = [t for t in map(tpot, done) if t is not None]
    makespan = max(end - start, 1e-9)
    result = summarize(sum(map(shown_tokens, seqs)), makespan, ttfts, e2e)
    # Past saturation the whole run's rate includes its ramp up: its second half is the engine's capacity.
    middle = start + makespan / 2
    late = [s for s in done if s.last_token_at is not None and s.last_token_at >= middle]
    result.update({"steady_requests_per_s": len(late) / (end - middle) if end > middle else float("nan"),
                   "steady_tok_s": sum(map(shown_tokens, late)) / (end - middle) if end > middle else float("nan")})
    result.update({"requests": len(seqs), "finished": len(done), "requests_per_s": len(done) / makespan,
                   "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
                   "preemptions": sum(s.preemptions for s in seqs)})
    return result


def within_slo(seqs: list[Sequence], ttft_s: float, tpot_s: float) -> float:
    """Share of the requests that finished with TTFT and TPOT both within the objective (goodput's test)."""
    if not seqs:
        return float("nan")
    good = 0
    for s in seqs:
        t = tpot(s)
        good += (s.finish_reason is not None and s.first_token_at is not None
                 and s.first_token_at - s.arrival <= ttft_s and (t is None or t <= tpot_s))
    return good / len(seqs)


def call_figures(calls: list[Call]) -> dict:
    turns = [t for c in calls for t in c.turns]
    ttfa = [t.ttfa_s for t in turns if t.ttfa_s is not None]
    return {"calls": len(calls), "turns": len(turns), "on_time": sum(t.on_time for t in turns),
            "on_time_rate": sum(t.on_time for t in turns) / len(turns) if turns else float("nan"),
            "ttfa_p50_s": percentile(ttfa, 50), "ttfa_p99_s": percentile(ttfa, 99),
            "turns_without_audio": sum(t.first_audio_at is None for t in turns),
            "underruns": sum(t.underruns for t in turns)}


def step_figures(steps: Iterable[tuple[StepShape, float]]) -> dict:
    """Step composition: how many, how long, and what they carried on average."""
    steps = list(steps)
    if not steps:
        return {"steps": 0}
    shapes = [s for s, _ in steps]
    seconds = np.array([t for _, t in steps])
    mean = lambda f: float(np.mean([f(s) for s in shapes]))  # noqa: E731
    return {"steps": len(steps), "busy_s": float(seconds.sum()), "step_p50_ms": 1e3 * float(np.median(seconds)),
            "step_p95_ms": 1e3 * float(np.percentile(seconds, 95)), "tokens_per_step": mean(lambda s: s.tokens),
            "decodes_per_step": mean(lambda s: s.decodes), "prefill_tokens_per_step": mean(lambda s: s.prefill_tokens),
            "seqs_per_step": mean(lambda s: s.seqs), "steps_with_prefill": mean(lambda s: s.prefill_tokens > 0)}
