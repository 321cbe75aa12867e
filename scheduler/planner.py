"""The step planner: which decodes and prefill shards the next model step carries.

Each step is packed under two budgets, `max_batch_tokens` and `max_batch_seqs`. Under the `o4` policy the
order is: pressing realtime decodes, other running decodes, then prefill shards by (aged) class and
deadline, a prompt taking whole shards of `shard_tokens` while the token budget lasts. A realtime request
is *pressing* when its deadline (the time its caller's buffered audio runs out, or its time-to-first-audio
deadline) is within `pressing_window_s`. Waiting requests climb one class per `aging_s` they wait, so batch
work never starves. When pages run out, lower-priority work is preempted (its pages released, to be
recomputed later, mostly from the prefix cache); a pressing realtime request never is.

What a step may give to other work than realtime replies (`Background`, the first rule that holds; the
step trace names it):
- `pressing`: a realtime reply is pressing: the step carries realtime work alone; a step's time grows
  with every sequence in it, so a reply about to miss its deadline gets the device's shortest steps.
- `deadline_near`: a realtime deadline is within two pressing windows: other prefill takes at most
  `realtime_prefill_tokens` of a step.
- `expecting`: a caller may be finishing their turn (`expect`: their VAD heard the first silence, until
  the turn's first audio or its deadline): a step carries at most `expect_background_seqs` other
  sequences and `expect_prefill_tokens` of other prefill. The end-of-turn ASR pass and the reply's
  prefill each wait first for the step in flight, and a wide decode batch beside a long prompt is the
  longest step there is. Decodes take turns (the one that waited longest goes first), so each stream
  slows a little rather than some stopping.
- `live_call`: calls are live: other prefill takes at most `live_prefill_tokens` a step, so a turn that
  begins does not first wait out a long step.
- `open`: everything.
The prefill share goes by a request's own class, so an aged prompt goes first among the others but does
not take a live call's short steps away.

`fcfs` is continuous batching without classes (running first, then waiting, by arrival; chunks as large as
the budget allows); `static` runs fixed batches that wait for their longest member.
"""

import math
import time
from collections import deque
from dataclasses import dataclass, field

from scheduler.config import EngineConfig
from scheduler.kv_pool import PoolExhausted, SlabPool
from scheduler.request import PRESSING_TIER, RequestClass, Sequence, Status


@dataclass(slots=True)
class Chunk:
    """One sequence's share of a step: tokens [start, start + n) go through the model."""

    seq: Sequence
    start: int
    n: int

    @property
    def samples(self) -> bool:
        return self.start + self.n == self.seq.num_tokens

    @property
    def kind(self) -> str:
        return "decode" if self.n == 1 and self.seq.output_ids else "prefill"

    @property
    def probe_row(self) -> int | None:
        """The row of this chunk whose logits its sequence's pending probe reads, if it carries it."""
        at = self.seq.params.probe_at
        return at - self.start if self.seq.probe_pending and self.start <= at < self.start + self.n else None


@dataclass(frozen=True, slots=True)
class Background:
    """What one step may give to work other than realtime replies."""

    allowed: bool = True  # False while a reply is pressing: the step carries realtime work alone
    prefill_tokens: float = math.inf  # the share of the step non-realtime prompts may take
    seqs: float = math.inf  # the non-realtime sequences the step may carry
    rule: str = "open"  # which rule set the share, for the step trace


REALTIME_ONLY = Background(allowed=False, prefill_tokens=0, seqs=0, rule="pressing")

# What a sequence asks of a step, in the order o4 serves it (before its class and deadline).
PRESSING_DECODE, DECODE, PREFILL = 0, 1, 2


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    rule: str = "open"  # the rule that bounded its background work (`Background.rule`)

    @property
    def num_tokens(self) -> int:
        return sum(c.n for c in self.chunks)


class StepPlanner:
    def __init__(self, config: EngineConfig, pool: SlabPool, eos_ids: frozenset[int] = frozenset()):
        self.config, self.pool, self.eos_ids = config, pool, eos_ids
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.by_id: dict[str, Sequence] = {}  # the unfinished sequences by request id
        self.output_lengths: deque[int] = deque(maxlen=256)
        self.live_sessions: set[str] = set()  # calls in progress, whose next turn may start at any moment
        self.expected: dict[str, float] = {}  # calls whose caller may be finishing -> until when
        self.steps_planned = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.by_id[seq.request_id] = seq

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def sequences(self) -> list[Sequence]:
        return self.running + self.waiting

    def stuck(self) -> list[Sequence]:
        """Waiting sequences when nothing runs and the last plan held nothing: the pool is too small."""
        return [] if self.running else list(self.waiting)

    def open_session(self, session: str) -> None:
        self.live_sessions.add(session)

    def close_session(self, session: str) -> None:
        """A call ended: its kept conversation prefix may go."""
        self.live_sessions.discard(session)
        self.expected.pop(session, None)
        self.pool.unpin(session)

    def expect(self, session: str, until: float | None) -> None:
        """A call's caller may be finishing their turn: keep steps short until `until` (None: no longer)."""
        if until is None:
            self.expected.pop(session, None)
        else:
            self.expected[session] = until

    def remap(self, moves: dict[int, int]) -> None:
        """Compaction moved pages: the running sequences' page tables follow."""
        for seq in self.running:
            seq.pages = [moves.get(p, p) for p in seq.pages]

    # -- priorities ------------------------------------------------------------------------------------
    def pressing(self, seq: Sequence, now: float) -> bool:
        return (seq.cls is RequestClass.REALTIME and seq.deadline is not None
                and seq.deadline - now <= self.config.pressing_window_s)

    def urgency(self, now: float) -> tuple:
        """The urgency of the pending model work, comparable with a job's (tier, deadline) key: pressing
        decodes share the top tier (PRESSING_TIER) with realtime jobs, and between them the earlier
        deadline goes first; otherwise the most urgent sequence's class and deadline."""
        seqs = self.sequences
        pressing = [s.deadline for s in seqs if self.pressing(s, now)]
        if pressing:
            return (PRESSING_TIER, min(pressing))
        return min(((self.effective_class(s, now), s.deadline or math.inf) for s in seqs), default=(math.inf,))

    def effective_class(self, seq: Sequence, now: float) -> int:
        return max(0, int(seq.cls) - int((now - seq.arrival) / self.config.aging_s))

    def _priority(self, seq: Sequence, now: float) -> tuple:
        if self.config.policy != "o4":
            return (seq.status is not Status.RUNNING, seq.arrival)
        decoding = seq.status is Status.RUNNING and seq.remaining_prefill == 1
        work = PRESSING_DECODE if decoding and self.pressing(seq, now) else DECODE if decoding else PREFILL
        deadline = seq.deadline if seq.deadline is not None else math.inf
        # Decodes take turns by the step that last carried them, so steps that cannot carry them all rotate.
        return (work, self.effective_class(seq, now), deadline, seq.last_step if decoding else seq.arrival)

    def predicted_output(self, seq: Sequence) -> int:
        """Growth to expect: the p95 of observed output lengths, capped by the request's own limit."""
        if len(self.output_lengths) >= 8:
            ranked = sorted(self.output_lengths)
            guess = ranked[min(len(ranked) - 1, int(0.95 * len(ranked)))]
        else:
            guess = self.config.default_output_guess
        return min(seq.params.max_tokens - len(seq.output_ids), guess)

    # -- planning --------------------------------------------------------------------------------------
    def plan(self, now: float | None = None) -> StepPlan:
        now = time.monotonic() if now is None else now
        if self.config.policy == "static":
            return self._plan_static()
        budget = self._background(now)
        plan = StepPlan(rule=budget.rule)
        self.steps_planned += 1
        tokens_left, seqs_left = self.config.max_batch_tokens, self.config.max_batch_seqs
        background_left, others_left = budget.prefill_tokens, budget.seqs
        planned: set[int] = set()
        for seq in sorted(self.sequences, key=lambda s: self._priority(s, now)):
            if tokens_left <= 0 or seqs_left <= 0:
                break
            # While a reply is pressing, nothing but realtime work; otherwise other prompts take a share, by
            # their own class: one aged into the realtime class goes first among them, not past the share.
            other = seq.cls > RequestClass.REALTIME
            background = seq.remaining_prefill > 1 and other
            if not budget.allowed and other or background and background_left <= 0 or other and others_left <= 0:
                continue
            if seq in plan.preempted or (seq.status is Status.WAITING and not self._admit(seq)):
                continue
            n = self._chunk_size(seq, min(tokens_left, background_left) if background else tokens_left)
            if not self._grow(seq, n, plan, planned, now):
                continue
            plan.chunks.append(Chunk(seq, seq.num_cached, n))
            seq.last_step = self.steps_planned
            planned.add(id(seq))
            tokens_left -= n
            seqs_left -= 1
            others_left -= other
            if background:
                background_left -= n
        return plan

    def _background(self, now: float) -> Background:
        """What a step may give to non-realtime work: all of it, unless (under `o4`) a realtime request's
        deadline approaches (within two pressing windows), whose next tokens would otherwise wait behind
        long steps; nothing at all, decodes included, while one is pressing. A reply whose caller has
        seconds of audio buffered slows nobody down."""
        if self.config.policy != "o4":
            return Background()
        slack = min((s.deadline - now for s in self.sequences
                     if s.cls is RequestClass.REALTIME and s.deadline is not None), default=math.inf)
        if slack <= self.config.pressing_window_s:
            return REALTIME_ONLY
        if slack <= 2 * self.config.pressing_window_s:
            return Background(prefill_tokens=self.config.realtime_prefill_tokens, rule="deadline_near")
        for session, until in list(self.expected.items()):
            if until <= now:
                del self.expected[session]
        if self.expected:  # a caller may be finishing: their turn's first work is about to arrive
            return Background(prefill_tokens=self.config.expect_prefill_tokens,
                              seqs=self.config.expect_background_seqs, rule="expecting")
        # A turn may begin at any moment of a live call, and waits first for the step in flight.
        if self.live_sessions:
            return Background(prefill_tokens=self.config.live_prefill_tokens, rule="live_call")
        return Background()

    def _chunk_size(self, seq: Sequence, tokens_left: int) -> int:
        """How many of seq's tokens this step carries: under `o4`, whole shards while the budget lasts.

        A sequence may take several shards in one step once everything ahead of it is packed: decodes
        never wait behind a prompt (they are packed first), and the most urgent prompt finishes sooner
        than if every prompt crept forward one shard a step.
        """
        n = min(seq.remaining_prefill, tokens_left)
        shard = self.config.shard_tokens
        if self.config.policy == "o4" and shard <= n < seq.remaining_prefill:
            n -= n % shard
        return n

    def _admit(self, seq: Sequence) -> bool:
        """Start a waiting request if the pool can hold its prompt and its predicted output.

        Cached pages holding a prefix of its tokens (an earlier turn of the same call, a shared system
        prompt, or its own tokens before a preemption) are taken over instead of recomputed.
        """
        pool = self.pool
        seq.pages = pool.match_prefix(seq.cacheable)
        seq.num_cached = len(seq.pages) * pool.page_tokens
        growth = pool.pages_for(seq.num_tokens + self.predicted_output(seq)) - len(seq.pages)
        while not pool.can_allocate(growth) and pool.unpin_oldest():
            pass  # idle sessions' kept prefixes give way to a request that needs the room
        if not pool.can_allocate(growth):
            pool.release(seq.pages, int(seq.cls))
            seq.pages, seq.num_cached = [], 0
            return False
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = Status.RUNNING
        return True

    def _grow(self, seq: Sequence, n: int, plan: StepPlan, planned: set[int], now: float) -> bool:
        """Make seq's pages cover n more tokens, preempting lower-priority work if memory runs out.

        Only a realtime decode may dip into the reserve.
        """
        pool = self.pool
        need = pool.pages_for(seq.num_cached + n) - len(seq.pages)
        use_reserve = seq.cls is RequestClass.REALTIME and seq.remaining_prefill == 1
        while not pool.can_allocate(need, use_reserve):
            if pool.unpin_oldest():
                continue
            victim = self._victim(seq, planned, now)
            if victim is None:
                return False
            self.preempt(victim)
            plan.preempted.append(victim)
        seq.pages += pool.allocate(need, use_reserve)
        return True

    def _victim(self, seq: Sequence, planned: set[int], now: float) -> Sequence | None:
        """The lowest-priority running sequence below seq that is not in this step; never a pressing one."""
        mine = self._priority(seq, now)
        candidates = [s for s in self.running if id(s) not in planned and s is not seq
                      and not self.pressing(s, now) and self._priority(s, now)[1:] > mine[1:]]
        return max(candidates, key=lambda s: self._priority(s, now)[1:], default=None)

    def preempt(self, seq: Sequence) -> None:
        """Recompute later: give back the pages (full ones stay cached), keep the tokens and the class."""
        self.pool.register(seq.pages, seq.page_keys)
        self.pool.release(seq.pages, int(seq.cls))
        seq.pages, seq.num_cached = [], 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.running.remove(seq)
        self.waiting.append(seq)

    def _plan_static(self) -> StepPlan:
        """A fixed batch: admitted together, prefilled whole, decoded until its longest member ends."""
        plan = StepPlan()
        if not self.running:
            batch = sorted(self.waiting, key=lambda s: s.arrival)[:self.config.static_batch_size]
            for seq in batch:
                if not self._admit(seq):
                    break
        for seq in self.running:
            if not self._grow(seq, seq.remaining_prefill, plan, set(), 0.0):
                raise PoolExhausted("a static batch outgrew the KV pool: lower static_batch_size")
            plan.chunks.append(Chunk(seq, seq.num_cached, seq.remaining_prefill))
        return plan

    # -- after the step --------------------------------------------------------------------------------
    def advance(self, chunk: Chunk) -> None:
        """Account for a chunk that went through the model; full pages become findable."""
        seq = chunk.seq
        seq.num_cached = chunk.start + chunk.n
        first, full = chunk.start // self.pool.page_tokens, seq.num_cached // self.pool.page_tokens
        if full > len(seq.page_keys):
            seq.page_keys = self.pool.page_keys(seq.tokens[:seq.num_cached], seq.page_keys)
        self.pool.register(seq.pages[first:full], seq.page_keys[first:full])

    def postprocess(self, seq: Sequence, token: int, complete: bool = False) -> str:
        """Append a sampled token; returns the text it adds. The sequence finishes at its end (the end
        token, a stop string, `complete`: its grammar allows nothing more) or at its length."""
        seq.output_ids.append(token)
        if seq.status is Status.FINISHED:  # padding in a static batch: computed, never shown
            return ""
        eos = token in self.eos_ids and not seq.params.ignore_eos
        text = "" if eos else seq.detokenizer.add(token)
        reason = "stop" if eos or complete or seq.detokenizer.stopped else \
            "length" if len(seq.output_ids) >= seq.params.max_tokens else None
        if reason is not None:
            text += seq.detokenizer.flush()
            self.finish(seq, reason)
        return text

    def finish(self, seq: Sequence, reason: str) -> None:
        """Release a finished sequence (a static batch keeps it as padding until the batch ends)."""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        self.by_id.pop(seq.request_id, None)
        self.output_lengths.append(len(seq.output_ids))
        if self.config.policy == "static" and any(s.status is Status.RUNNING for s in self.running):
            return
        for member in list(self.running):
            if member.status is Status.FINISHED or member is seq:
                self._release(member)

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq.session is not None and seq.num_cached:
            self.pool.register(seq.pages, seq.page_keys)
            self.pool.pin(seq.session, seq.pages[:seq.num_cached // self.pool.page_tokens], int(seq.cls))
        self.pool.release(seq.pages, int(seq.cls))
        seq.pages = []

    def abort(self, seq: Sequence) -> None:
        seq.status, seq.finish_reason = Status.FINISHED, "abort"
        self.by_id.pop(seq.request_id, None)
        self._release(seq)
