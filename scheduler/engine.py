"""The engine core: one owner of the device runs model steps and device jobs.

Why one owner: on a small machine several thread pools (torch, CTranslate2, onnxruntime) fighting for the
same cores run 5-10x slower, and on a GPU one stream of work is what a scheduler can reason about. So ASR
and TTS calls are not made by whoever needs them: they are submitted as typed jobs with a class and a
deadline, and the engine starts them most urgent first, either between model steps (weighed against the
model's own work) or on a lane of their own beside the steps, each runtime sized to its share of the cores
(`scheduler.job_lane`, `EngineConfig.job_threads`).

The core is synchronous, like nano-vllm's: one thread plans and runs the steps, commands go in between
steps (a job that comes while the lane is idle starts when the step in flight ends), and each step leaves its
outputs (tokens and job results) in `outputs` for whoever drives it to take. Two drivers exist
(`scheduler.channel.client`): a thread beside the caller's event loop, and a process of its own.
"""

import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from scheduler.config import EngineConfig, check_knobs
from scheduler.detokenizer import Detokenizer
from scheduler.grammar.cache import GrammarCache
from scheduler.grammar.constraint import Constraints, Grammar
from scheduler.job_lane import InlineLane, JobLane, ThreadLane
from scheduler.jobs import Job, JobHandler, JobQueue, JobResult
from scheduler.kv_pool import SlabPool
from scheduler.metrics import Metrics, StepRecord
from scheduler.model.runner import ModelRunner
from scheduler.planner import StepPlan, StepPlanner
from scheduler.request import Output, RequestClass, Sequence, Status, check_request
from scheduler.sampler import probability_of, probe_rows, sample_rows
from scheduler.step_shape import StepShape

log = logging.getLogger(__name__)
GRAMMAR_WAIT_S = 0.01  # with only compiles in flight, how long a step waits for one before the next commands
JOB_WAIT_S = 0.005  # with only a job on the lane, how long a step waits for it before the next commands


class Runner(Protocol):
    """What a step asks of the model: `ModelRunner`, or the simulator's stand-in that prices the step."""

    num_slabs: int
    pages_per_slab: int

    def run(self, plan: StepPlan) -> torch.Tensor: ...

    def copy_pages(self, moves: dict[int, int]) -> None: ...


class Engine:
    def __init__(self, model: torch.nn.Module, tokenizer, config: EngineConfig | None = None,
                 jobs: dict[str, JobHandler] | None = None, runner: Runner | None = None,
                 clock: Callable[[], float] = time.monotonic, lane: JobLane | None = None):
        """`runner`, `clock` and `lane` are the model's own runner, the wall clock and the lane the config
        asks for unless given: the simulator (scheduler.sim) passes a runner that prices each step on a
        virtual clock, so the same planner, pool and job queue run at a scale this machine cannot."""
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.clock = clock
        self.runner = runner if runner is not None else ModelRunner(model, self.config)
        self.pool = SlabPool(self.runner.num_slabs, self.runner.pages_per_slab, self.config.page_tokens,
                             self.config.reserve_frac)
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [eos])
        self.planner = StepPlanner(self.config, self.pool, self.eos_ids)
        self.metrics = Metrics()
        # The longest sequence (prompt and answer) one request may grow to: what the model's positions
        # cover, and half the pool, so that one request cannot starve every other.
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 1 << 30
        self.max_context = min(positions, self.pool.num_pages * self.pool.page_tokens // 2)
        vocab = getattr(getattr(model, "config", None), "vocab_size", None) or len(tokenizer)
        cfg = self.config
        self.constraints = Constraints(tokenizer, vocab, self.eos_ids, cfg.grammar_budget_s, cfg.grammar_memory_bytes,
                                       GrammarCache(cfg.grammar_cache_entries, cfg.grammar_cache_bytes))
        # The clients' questions whether a grammar compiles (`prepare_grammar`), by query id (the requests
        # that wait for theirs are the planner's, WAITING_FOR_GRAMMAR).
        self.preparing: dict[int, Grammar] = {}
        self.answers: list[tuple[int, str | None]] = []  # (query id, error) of preparations since last taken
        self.handlers: dict[str, JobHandler] = dict(jobs or {})
        self.jobs = JobQueue()
        self.lane = lane or (ThreadLane() if self.config.job_threads else InlineLane(self.clock))
        self.lane.refill = lambda: self.jobs.take(self.handlers)
        self.outputs: list[tuple[str, Output]] = []  # (request id, output) since the driver last took them
        self.job_results: list[JobResult] = []
        self.force_compaction = False

    # -- the step ----------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run the most urgent unit of device work: a job or a model step (or both, with a lane beside the
        steps). False when there was none. Grammars that finished compiling are taken first; with nothing
        else to do, it waits a moment for one (or for the job on the lane)."""
        if self.constraints.pending:
            idle = self.planner.idle and not self.jobs and not self.lane.busy
            self._grammars_compiled(GRAMMAR_WAIT_S if idle else 0.0)
            if self.planner.idle and not self.jobs:
                return True
        now = self.clock()
        # Between steps, a job goes first when the model has nothing to do, or nothing more urgent; it wins a
        # tie, since it unblocks audio. A lane beside the steps takes the most urgent job whenever it is free.
        if self.jobs and not self.lane.busy and (self.lane.beside or self.planner.idle
                                                 or self.jobs.first_key(now, self.config.aging_s)
                                                 <= self.planner.urgency(now)):
            self._start_jobs()
            if not self.lane.beside:
                return True
        if self.planner.idle:
            if not self.lane.busy:
                return False
            self.lane.wait(JOB_WAIT_S)
            return True
        self._model_step(now)
        return True

    def take_outputs(self) -> tuple[list[tuple[str, Output]], list[JobResult], list[tuple[int, str | None]]]:
        """What the steps and commands since the last call produced, for the driver to deliver: requests'
        outputs, jobs' results, and answers to `prepare_grammar` (query id, None or why it cannot compile)."""
        ran = self.lane.take()
        for result in ran:
            self.metrics.job_done(result.kind, result.seconds)
        outputs, results, answers = self.outputs, self.job_results + ran, self.answers
        self.outputs, self.job_results, self.answers = [], [], []
        return outputs, results, answers

    def _start_jobs(self) -> None:
        """The most urgent job, with those of its kind its handler batches, onto the lane."""
        batch = self.jobs.take(self.handlers)
        if batch is not None:
            self.lane.start(*batch)

    def _model_step(self, now: float) -> None:
        """Plan, run, postprocess: the step's outputs go to `outputs`, its figures to the metrics at once."""
        plan = self.planner.plan(now)
        if not plan.chunks:  # nothing fits even with everything else preempted: the pool is too small
            for seq in self.planner.stuck():
                self._finish(seq, "error: the KV pool cannot hold this request")
            return
        step = StepRecord(plan, self.clock())
        sampling = [c.seq for c in plan.chunks if c.samples]
        try:
            tokens, probes = self._run(plan, sampling, step)
        except Exception as exc:  # a fault in one step (an OOM, a kernel bug) fails that step's requests only
            self._fail_step(plan, exc)
            return
        step.ended = self.clock()
        self.planner.costs.observe(StepShape.of(plan), step.ended - step.started)
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.num_cached == 0 and chunk.start == 0 and seq.first_token_at is None:
                step.queued.append((seq.cls.name, step.started - seq.arrival))
            self.planner.advance(chunk)
        for seq, token, probe in zip(sampling, tokens, probes, strict=True):
            self._postprocess(seq, token, probe, step)
        self.metrics.record_step(step)
        self._maybe_compact()

    def _run(self, plan: StepPlan, sampling: list[Sequence], step: StepRecord) -> tuple[list[int], list]:
        """The model over the plan, then one token per sampling row: probes read before any grammar's mask
        (the model's own belief), constrained rows masked (a batch without any: nothing)."""
        logits = self.runner.run(plan)
        probed = [c.seq for c in plan.chunks if c.probe_row is not None]
        for seq, row in zip(probed, logits[len(sampling):], strict=True):
            seq.probe = probability_of(row, seq.params.probe_tokens)
        logits = logits[:len(sampling)]
        params = [s.params for s in sampling]
        probes = probe_rows(logits, params)
        if self.constraints.active:  # a finished padding row has no matcher left: never masked
            t0 = self.clock()
            if self.constraints.mask(logits, [s.request_id for s in sampling]):
                step.mask_s = self.clock() - t0
        tokens = sample_rows(logits, params, [len(s.output_ids) for s in sampling]) if sampling else []
        return tokens, probes

    def _fail_step(self, plan: StepPlan, exc: Exception) -> None:
        log.exception("a model step failed; its %d requests fail with it", len(plan.chunks))
        self.metrics.step_faults.inc()
        for chunk in plan.chunks:
            if chunk.seq.status is not Status.FINISHED:
                self._finish(chunk.seq, f"error: the model step failed ({type(exc).__name__}: {exc})")

    def _maybe_compact(self) -> None:
        if self.force_compaction or self.pool.fragmentation() > self.config.compact_threshold:
            self.force_compaction = False
            moves = self.pool.plan_compaction()
            if moves:
                self.runner.copy_pages(moves)
                self.planner.remap(moves)
                self.metrics.compactions.inc()

    # -- tokens out --------------------------------------------------------------------------------------
    def _postprocess(self, seq: Sequence, token: int, probe: float | None, step: StepRecord) -> None:
        """Stream a sampled token (the planner appends it and decides whether the request ends there)."""
        if seq.status is Status.FINISHED:  # padding in a static batch
            self.planner.postprocess(seq, token)
            return
        cls, now = seq.cls.name, step.ended
        cached = None
        if seq.first_token_at is None:
            cached = seq.reused
            step.first_tokens.append((cls, now - seq.arrival))
            seq.first_token_at = now
            probe = seq.probe if seq.params.probe_at is not None else probe
        else:
            step.gaps.append((cls, now - seq.last_token_at))
        seq.last_token_at = now
        step.generated[cls] = step.generated.get(cls, 0) + 1
        complete = self.constraints.accept(seq.request_id, token)  # its grammar allows nothing more
        self.outputs.append((seq.request_id, Output(token, self.planner.postprocess(seq, token, complete),
                                                    probe=probe, cached=cached)))
        if seq.status is Status.FINISHED:
            step.finished.append((cls, now - seq.arrival))
            self._ended(seq)

    def _finish(self, seq: Sequence, reason: str) -> None:
        """End a request before its time (an abort, a refusal, a fault) and say so."""
        self.planner.abort(seq, reason)
        self._ended(seq)

    def _ended(self, seq: Sequence) -> None:
        self.constraints.drop(seq.request_id)
        self.outputs.append((seq.request_id, Output(None, "", True, seq.finish_reason)))

    # -- grammars ----------------------------------------------------------------------------------------
    def _grammars_compiled(self, wait_s: float) -> None:
        """Admit the requests whose grammar compiled, fail those whose did not, answer the preparations."""
        for key, compiled, error in self.constraints.finished(wait_s):
            self.metrics.grammar_compiles.labels(error.partition(":")[0] if error else "compiled").inc()
            for seq in self.planner.grammar_waiters(key):
                if compiled is None:
                    self._finish(seq, f"error: {error}")
                else:
                    self.constraints.add(seq.request_id, compiled)
                    self.planner.grammar_ready(seq)
            for query_id in [q for q, grammar in self.preparing.items() if grammar.key == key]:
                del self.preparing[query_id]
                self.answers.append((query_id, error))

    # -- commands (from the driver, between steps) -------------------------------------------------------
    def add_request(self, seq: Sequence) -> Sequence:
        """Queue a request; its outputs appear in `outputs` under its id. One that cannot run ends there with
        the reason, and raises ValueError for a caller in this process."""
        try:
            check_request(seq.prompt_ids, seq.params)
        except ValueError as e:
            self._finish(seq, f"error: {e}")
            raise
        seq.detokenizer = Detokenizer(self.tokenizer, seq.params.stop)
        grammar = seq.params.grammar
        compiled = self.constraints.compiled(grammar) if grammar is not None else None
        refused = self.constraints.refusal(grammar) if grammar is not None and compiled is None else None
        if refused is not None:
            self._finish(seq, f"error: {refused}")
            return seq
        waits = grammar is not None and compiled is None
        if waits:
            self.constraints.compile(grammar)
        elif compiled is not None:
            self.constraints.add(seq.request_id, compiled)
        self.planner.add(seq, waits_for_grammar=waits)
        return seq

    def prepare_grammar(self, query_id: int, grammar: Grammar) -> None:
        """Compile `grammar` ahead of the requests that will use it; `answers` gets (query_id, None) once it
        is ready, or (query_id, "code: why") if it cannot be."""
        if self.constraints.compiled(grammar) is not None or self.constraints.refusal(grammar) is not None:
            self.answers.append((query_id, self.constraints.refusal(grammar)))
            return
        try:
            grammar.check()
            self.constraints.compile(grammar)
        except ValueError as e:
            self.answers.append((query_id, f"invalid_grammar: {e}"))
            return
        self.preparing[query_id] = grammar

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """End a request (one waiting for its grammar too: the compile goes on, and is cached)."""
        seq = self.planner.by_id.get(request_id)
        if seq is not None:
            self._finish(seq, reason)

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """Move a request's deadline, e.g. to when its caller's buffered audio will run out."""
        seq = self.planner.by_id.get(request_id)
        if seq is not None:
            seq.deadline = deadline

    def promote(self, request_id: str, cls: RequestClass, deadline: float | None, session: str | None) -> None:
        """Raise a request's class, e.g. a speculative reply whose turn was confirmed; `session` pins its
        conversation prefix when it ends, as if it had been submitted that way."""
        seq = self.planner.by_id.get(request_id)
        if seq is not None:
            seq.cls, seq.deadline, seq.session = cls, deadline, session

    def open_session(self, session: str) -> None:
        """A call began: while any is live, steps stay short enough for its next turn (see the planner)."""
        self.planner.open_session(session)

    def expect(self, session: str, until: float | None) -> None:
        """A call's caller may be finishing their turn: keep steps short until `until` (None: the turn's
        first audio is out, or the caller spoke on); see the planner."""
        self.planner.expect(session, until)

    def release_session(self, session: str) -> None:
        """A call ended: its kept conversation prefix may go."""
        self.planner.close_session(session)

    def update_config(self, **knobs: int) -> None:
        """Turn the knobs; all are checked before any is applied."""
        check_knobs(knobs)
        for name, value in knobs.items():
            setattr(self.config, name, value)

    def submit_job(self, job: Job) -> None:
        if job.kind not in self.handlers:
            self.job_results.append(JobResult(job.job_id, job.kind, error=f"no device job named {job.kind!r}"))
        else:
            job.queued_at = self.clock()
            self.jobs.push(job)

    def cancel_job(self, job_id: str) -> None:
        self.jobs.cancel(job_id)

    # -- views -------------------------------------------------------------------------------------------
    @property
    def requests(self) -> dict[str, Sequence]:
        """The unfinished requests by id, those waiting for their grammar too (the planner's)."""
        return self.planner.by_id

    def close(self) -> None:
        """Stop what the engine runs beside it (the grammar worker, the job lane), and keep its step-cost
        fit for the next start."""
        self.constraints.close()
        self.lane.close()
        self.planner.costs.save()

