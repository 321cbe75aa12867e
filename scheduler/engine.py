"""The engine loop: one thread owns the device and runs model steps and device jobs one at a time.

Why one thread: on a small machine several thread pools (torch, CTranslate2, onnxruntime) fighting for
the same cores run 5-10x slower, and on a GPU one stream of work is what a scheduler can reason about.
So ASR and TTS calls are not run beside the model: they are submitted as jobs with a class and a deadline
and run between model steps, in priority order against the model's own work. The asyncio side talks to
the loop through a thread-safe inbox and gets tokens back on its own event loop.
"""

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch

from scheduler.config import KNOBS, EngineConfig
from scheduler.detokenizer import Detokenizer
from scheduler.jobs import JobQueue, notify
from scheduler.kv_pool import SlabPool
from scheduler.metrics import Metrics
from scheduler.planner import StepPlan, StepPlanner
from scheduler.request import Output, RequestClass, SamplingParams, Sequence, Status
from scheduler.runner import ModelRunner
from scheduler.sampler import sample_rows

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, model: torch.nn.Module, tokenizer, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.runner = ModelRunner(model, self.config)
        self.pool = SlabPool(self.runner.num_slabs, self.runner.pages_per_slab, self.config.page_tokens,
                             self.config.reserve_frac)
        self.planner = StepPlanner(self.config, self.pool)
        self.metrics = Metrics()
        # The longest sequence (prompt and answer) one request may grow to: what the model's positions
        # cover, and half the pool, so that one request cannot starve every other.
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 1 << 30
        self.max_context = min(positions, self.pool.num_pages * self.pool.page_tokens // 2)
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.requests: dict[str, Sequence] = {}
        self.jobs = JobQueue()
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.force_compaction = False

    # -- the loop ----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="voicepipe-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stopping:
            self._wake.wait(timeout=0.05)
            self._wake.clear()
            while not self._stopping and self.step():
                pass

    def _call_in_loop(self, fn: Callable[[], None]) -> None:
        """Run fn on the engine thread between steps (right away when no loop thread is running)."""
        if self._thread is None:
            fn()
        else:
            self._inbox.put(fn)
            self._wake.set()

    def step(self) -> bool:
        """Run the most urgent unit of device work: a job or a model step. False when there was none."""
        while not self._inbox.empty():
            self._inbox.get()()
        now = time.monotonic()
        # A job goes first when the model has nothing to do, or nothing more urgent; it wins a tie, since it
        # unblocks audio.
        if self.jobs and (self.planner.idle or self.jobs.first_key() <= self.planner.urgency(now)):
            job = self.jobs.pop()
            self.metrics.job_done(job.kind, job.run())
            return True
        if self.planner.idle:
            return False
        self._model_step(now)
        return True

    def _model_step(self, now: float) -> None:
        plan = self.planner.plan(now)
        for seq in plan.preempted:
            self.metrics.preemptions.labels(seq.cls.name).inc()
        if not plan.chunks:
            self._fail_stuck()
            return
        t0 = time.monotonic()
        logits = self.runner.run(plan)
        done = time.monotonic()
        self._record_step(plan, t0, done)
        sampling = [c.seq for c in plan.chunks if c.samples]
        tokens = sample_rows(logits, [s.params for s in sampling], [len(s.output_ids) for s in sampling]) \
            if sampling else []
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.num_cached == 0 and chunk.start == 0 and seq.first_token_at is None:
                self.metrics.queue_time.labels(seq.cls.name).observe(t0 - seq.arrival)
            self.planner.advance(chunk)
        for seq, token in zip(sampling, tokens, strict=True):
            self._append_token(seq, token, done)
        self._maybe_compact()

    def _fail_stuck(self) -> None:
        """Nothing fits even with everything else preempted: the pool is too small for a request."""
        for seq in [s for s in self.planner.waiting if not self.planner.running]:
            self._finish(seq, "error: the KV pool cannot hold this request")

    def _record_step(self, plan: StepPlan, t0: float, t1: float) -> None:
        decode = sum(c.n for c in plan.chunks if c.kind == "decode")
        prefill = plan.num_tokens - decode
        m = self.metrics
        m.steps.inc()
        m.steps_run += 1
        m.step_seconds.observe(t1 - t0)
        m.step_tokens.labels("decode").inc(decode)
        m.step_tokens.labels("prefill").inc(prefill)
        m.recent_steps.append({
            "t": t1, "duration_s": t1 - t0, "decode_tokens": decode, "prefill_tokens": prefill,
            "seqs": len(plan.chunks), "preempted": len(plan.preempted),
            "chunks": [{"id": c.seq.request_id, "cls": c.seq.cls.name, "kind": c.kind, "start": c.start,
                        "n": c.n} for c in plan.chunks],
        })
        for chunk in plan.chunks:
            if chunk.kind == "prefill":
                m.prompt_tokens.labels(chunk.seq.cls.name).inc(chunk.n)

    def _maybe_compact(self) -> None:
        if self.force_compaction or self.pool.fragmentation() > self.config.compact_threshold:
            self.force_compaction = False
            moves = self.pool.plan_compaction()
            if moves:
                self.runner.copy_pages(moves)
                for seq in self.planner.running:
                    seq.pages = [moves.get(p, p) for p in seq.pages]
                self.metrics.compactions.inc()

    # -- tokens out --------------------------------------------------------------------------------------
    def _append_token(self, seq: Sequence, token: int, now: float) -> None:
        if seq.status is Status.FINISHED:  # padding in a static batch: computed, never shown
            seq.output_ids.append(token)
            return
        cls = seq.cls.name
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.metrics.ttft.labels(cls).observe(now - seq.arrival)
        else:
            self.metrics.itl.labels(cls).observe(now - seq.last_token_at)
        seq.last_token_at = now
        self.metrics.count_tokens(1, cls)
        seq.output_ids.append(token)
        eos = token in self.eos_ids and not seq.params.ignore_eos
        text = "" if eos else seq.detokenizer.add(token)
        if eos or seq.detokenizer.stopped:
            reason = "stop"
        elif len(seq.output_ids) >= seq.params.max_tokens:
            reason = "length"
        else:
            reason = None
        if reason is not None:
            text += seq.detokenizer.flush()
        self._emit(seq, Output(token, text))
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.planner.finish(seq)
        self.requests.pop(seq.request_id, None)
        self.metrics.e2e.labels(seq.cls.name).observe(time.monotonic() - seq.arrival)
        self._emit(seq, Output(None, "", True, reason))

    def _emit(self, seq: Sequence, out: Output) -> None:
        if seq.outbox is not None:
            loop, box = seq.outbox
            notify(loop, box.put_nowait, out)

    # -- requests in -------------------------------------------------------------------------------------
    def add_request(self, seq: Sequence) -> Sequence:
        """Queue a request (thread-safe); its outputs go to seq.outbox if set."""
        if not seq.prompt_ids:
            raise ValueError("empty prompt")
        if seq.params.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")

        seq.detokenizer = Detokenizer(self.tokenizer, seq.params.stop)

        def add() -> None:
            self.requests[seq.request_id] = seq
            self.planner.add(seq)

        self._call_in_loop(add)
        return seq

    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                       cls: RequestClass = RequestClass.INTERACTIVE, deadline: float | None = None,
                       session: str | None = None, request_id: str | None = None) -> AsyncIterator[Output]:
        """Stream a request's outputs; leaving the loop early (or being cancelled) aborts it."""
        seq = Sequence(list(prompt_ids), params or SamplingParams(), cls, deadline, session)
        if request_id is not None:
            seq.request_id = request_id
        box: asyncio.Queue[Output] = asyncio.Queue()
        seq.outbox = (asyncio.get_running_loop(), box)
        self.add_request(seq)
        finished = False
        try:
            while not finished:
                out = await box.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(seq.request_id)

    def abort(self, request_id: str) -> None:
        def drop() -> None:
            seq = self.requests.pop(request_id, None)
            if seq is not None:
                seq.finish_reason = "abort"
                self.planner.abort(seq)
                self._emit(seq, Output(None, "", True, "abort"))

        self._call_in_loop(drop)

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """Move a request's deadline, e.g. to when its caller's buffered audio will run out."""
        def move() -> None:
            if request_id in self.requests:
                self.requests[request_id].deadline = deadline

        self._call_in_loop(move)

    def promote(self, request_id: str, cls: RequestClass, deadline: float | None, session: str | None) -> None:
        """Raise a request's class, e.g. a speculative reply whose turn was confirmed; `session` pins its
        conversation prefix when it ends, as if it had been submitted that way."""
        def move() -> None:
            seq = self.requests.get(request_id)
            if seq is not None:
                seq.cls, seq.deadline, seq.session = cls, deadline, session

        self._call_in_loop(move)

    def open_session(self, session: str) -> None:
        """A call began: while any is live, steps stay short enough for its next turn (see the planner)."""
        self._call_in_loop(lambda: self.planner.live_sessions.add(session))

    def release_session(self, session: str) -> None:
        """A call ended: its kept conversation prefix may go."""
        def release() -> None:
            self.planner.live_sessions.discard(session)
            self.pool.unpin(session)

        self._call_in_loop(release)

    def update_config(self, **knobs: int) -> None:
        """Turn the knobs of the running engine; values are checked here, applied between steps."""
        for name, value in knobs.items():
            if name not in KNOBS:
                raise ValueError(f"unknown knob {name!r}; knobs are {', '.join(KNOBS)}")
            lo, hi = KNOBS[name]
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}]")

        def apply() -> None:
            for name, value in knobs.items():
                setattr(self.config, name, value)

        self._call_in_loop(apply)

    # -- device jobs -------------------------------------------------------------------------------------
    async def run_job(self, fn: Callable[[], Any], cls: RequestClass = RequestClass.INTERACTIVE,
                      deadline: float | None = None, kind: str = "job") -> Any:
        """Run fn on the engine thread between model steps, in priority order; returns its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        job = self.jobs.make(fn, cls, deadline, kind, loop, future)
        self._call_in_loop(lambda: self.jobs.push(job))
        return await future

    # -- views -------------------------------------------------------------------------------------------
    def busy(self) -> bool:
        """Jobs queued, or a realtime request in flight: optional work had better wait (a read from any
        thread, not a lock)."""
        seqs = [*self.planner.running, *self.planner.waiting]
        return bool(self.jobs) or any(s.cls is RequestClass.REALTIME for s in seqs)

    def live_tables(self) -> list[list[int]]:
        return [s.pages for s in self.planner.running + self.planner.waiting]

    def check_pool(self) -> None:
        self.pool.check(self.live_tables())

    def queue_counts(self) -> dict[str, dict[str, int]]:
        """Requests waiting and running, by class (read from any thread; a view, not a lock)."""
        queues = {c.name: {"waiting": 0, "running": 0} for c in RequestClass}
        for state, seqs in (("waiting", list(self.planner.waiting)), ("running", list(self.planner.running))):
            for s in seqs:
                queues[s.cls.name][state] += 1
        return queues

    def refresh_gauges(self) -> None:
        """Set the queue and pool gauges to now, for a scrape of the metrics."""
        for cls, states in self.queue_counts().items():
            for state, n in states.items():
                self.metrics.queue_depth.labels(cls, state).set(n)
        self.metrics.kv_usage.set(self.pool.num_used / self.pool.num_pages)
        self.metrics.kv_fragmentation.set(self.pool.fragmentation())

    def snapshot(self) -> dict:
        """Plain data for the notebook and the web page (read from any thread; a view, not a lock)."""
        pool, m = self.pool, self.metrics
        queues = self.queue_counts()
        usage = pool.num_used / pool.num_pages
        return {
            "config": {"policy": self.config.policy, "max_batch_tokens": self.config.max_batch_tokens,
                       "max_batch_seqs": self.config.max_batch_seqs, "shard_tokens": self.config.shard_tokens,
                       "page_tokens": pool.page_tokens},
            "queues": queues,
            "tokens_per_s": m.tokens_per_second(),
            "pool": {"pages": pool.num_pages, "slabs": pool.num_slabs, "pages_per_slab": pool.pages_per_slab,
                     "used": pool.num_used, "free": pool.num_free, "cached": len(pool.lru),
                     "pinned_sessions": len(pool.pins), "usage": usage,
                     "fragmentation": pool.fragmentation(), "reserve": pool.reserve},
            "steps": list(m.recent_steps)[-50:],
        }

    def page_map(self) -> list[str]:
        """Each page's state, slab by slab: 'owned', 'cached' or 'free' (for drawing the pool)."""
        free = {p for f in self.pool.free_lists for p in f}
        return ["free" if p in free else "cached" if p in self.pool.lru else "owned"
                for p in range(self.pool.num_pages)]
