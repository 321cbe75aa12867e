"""Prometheus metrics for the engine (and the stages that share it), plus an in-process snapshot.

Each engine owns its registry, so several engines (tests, benchmarks) never collide; the server exposes
it on /metrics. Latency buckets reach well under 300 ms, where voice turns live.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.planner import StepPlan

FAST = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class StepRecord:
    """What one model step did, gathered while it runs and recorded into the metrics at once after it:
    (class, seconds) pairs for the waits, first tokens, token gaps and finished requests it saw."""

    plan: StepPlan
    started: float
    ended: float = 0.0
    mask_s: float | None = None  # its grammar masks, if any row was constrained
    queued: list[tuple[str, float]] = field(default_factory=list)  # first scheduled: arrival to now
    first_tokens: list[tuple[str, float]] = field(default_factory=list)
    gaps: list[tuple[str, float]] = field(default_factory=list)
    finished: list[tuple[str, float]] = field(default_factory=list)  # arrival to finish
    generated: dict[str, int] = field(default_factory=dict)  # tokens shown, by class


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        by_class = ["cls"]
        self.ttft = Histogram("voicepipe_time_to_first_token_seconds", "Arrival to first token", by_class,
                              buckets=FAST, registry=r)
        self.itl = Histogram("voicepipe_inter_token_latency_seconds", "Gap between tokens", by_class,
                             buckets=FAST, registry=r)
        self.queue_time = Histogram("voicepipe_request_queue_time_seconds", "Arrival to first scheduled",
                                    by_class, buckets=FAST, registry=r)
        self.e2e = Histogram("voicepipe_e2e_request_latency_seconds", "Arrival to finish", by_class,
                             buckets=FAST, registry=r)
        self.tokens = Counter("voicepipe_generation_tokens", "Tokens generated", by_class, registry=r)
        self.prompt_tokens = Counter("voicepipe_prompt_tokens", "Prompt tokens computed", by_class, registry=r)
        self.preemptions = Counter("voicepipe_preemptions", "Requests preempted (recompute)", by_class,
                                   registry=r)
        self.step_tokens = Counter("voicepipe_step_tokens", "Tokens run per kind of work", ["kind"], registry=r)
        self.steps = Counter("voicepipe_steps", "Model steps run", registry=r)
        self.step_seconds = Histogram("voicepipe_step_duration_seconds", "One model step", buckets=FAST,
                                      registry=r)
        self.jobs = Histogram("voicepipe_job_duration_seconds", "Device jobs (ASR, TTS), each its batch's run",
                              ["kind"], buckets=FAST, registry=r)
        self.queue_depth = Gauge("voicepipe_queue_depth", "Requests waiting or running", ["cls", "state"],
                                 registry=r)
        self.kv_usage = Gauge("voicepipe_kv_cache_usage_ratio", "Share of KV pages in use", registry=r)
        self.kv_fragmentation = Gauge("voicepipe_kv_fragmentation_ratio",
                                      "Free pages stranded in partly used slabs over all free pages", registry=r)
        self.step_faults = Counter("voicepipe_step_faults", "Model steps that raised (their requests failed)",
                                   registry=r)
        self.compactions = Counter("voicepipe_kv_compactions", "Compactions run", registry=r)
        self.mask_seconds = Histogram("voicepipe_grammar_mask_seconds",
                                      "Filling and applying the grammar masks of one step's constrained rows",
                                      buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1), registry=r)
        self.grammar_compiles = Counter("voicepipe_grammar_compiles", "Grammar compiles that ended, by outcome "
                                        "(compiled, grammar_too_complex: past the budget, invalid_grammar)",
                                        ["outcome"], registry=r)
        self.recent_steps: deque[dict] = deque(maxlen=200)
        self.steps_run = 0
        self._token_times: deque[tuple[float, int]] = deque(maxlen=2000)

    def record_step(self, step: StepRecord) -> None:
        """Everything one model step changes in the metrics."""
        plan = step.plan
        decode = sum(c.n for c in plan.chunks if c.kind == "decode")
        self.steps.inc()
        self.steps_run += 1
        self.step_seconds.observe(step.ended - step.started)
        self.step_tokens.labels("decode").inc(decode)
        self.step_tokens.labels("prefill").inc(plan.num_tokens - decode)
        for chunk in plan.chunks:
            if chunk.kind == "prefill":
                self.prompt_tokens.labels(chunk.seq.cls.name).inc(chunk.n)
        for seq in plan.preempted:
            self.preemptions.labels(seq.cls.name).inc()
        if step.mask_s is not None:
            self.mask_seconds.observe(step.mask_s)
        for histogram, pairs in ((self.queue_time, step.queued), (self.ttft, step.first_tokens),
                                 (self.itl, step.gaps), (self.e2e, step.finished)):
            for cls, seconds in pairs:
                histogram.labels(cls).observe(seconds)
        for cls, n in step.generated.items():
            self.count_tokens(n, cls)
        self.recent_steps.append({
            "t": step.ended, "duration_s": step.ended - step.started, "decode_tokens": decode,
            "prefill_tokens": plan.num_tokens - decode, "seqs": len(plan.chunks), "preempted": len(plan.preempted),
            "rule": plan.rule,
            "chunks": [{"id": c.seq.request_id, "cls": c.seq.cls.name, "kind": c.kind, "start": c.start,
                        "n": c.n} for c in plan.chunks],
        })

    def job_done(self, kind: str, seconds: float) -> None:
        self.jobs.labels(kind).observe(seconds)

    def count_tokens(self, n: int, cls: str) -> None:
        self.tokens.labels(cls).inc(n)
        self._token_times.append((time.monotonic(), n))

    def tokens_per_second(self, window_s: float = 5.0) -> float:
        now = time.monotonic()
        return sum(n for t, n in self._token_times if now - t <= window_s) / window_s
