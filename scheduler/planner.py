"""The step planner: which decodes and prefill shards the next model step carries.

Each step is packed under two budgets, `max_batch_tokens` and `max_batch_seqs`, in the order the policy
(`scheduler.policies`, `config.policy`) gives, within the share it gives work other than realtime
replies, each sequence taking the chunk the policy sizes. A realtime request is *pressing* when its
deadline (the time its caller's buffered audio runs out, or its time-to-first-audio deadline) is within
`pressing_window_s`. Waiting requests climb one class per `aging_s` they wait, so batch work never
starves. When pages run out, lower-priority work is preempted (its pages released, to be recomputed later,
mostly from the prefix cache); a pressing realtime request never is.
"""

import math
import time
from collections import deque

from scheduler.config import EngineConfig
from scheduler.kv_pool import SlabPool
from scheduler.policies import make_policy
from scheduler.request import PRESSING_TIER, RequestClass, Sequence, Status
from scheduler.step_cost import OnlineCost
from scheduler.step_plan import Chunk, StepPlan
from scheduler.step_shape import Tally


class StepPlanner:
    def __init__(self, config: EngineConfig, pool: SlabPool, eos_ids: frozenset[int] = frozenset()):
        self.config, self.pool, self.eos_ids = config, pool, eos_ids
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.by_id: dict[str, Sequence] = {}  # the unfinished sequences by request id, their grammar's waiters too
        self.output_lengths: deque[int] = deque(maxlen=256)
        self.live_sessions: set[str] = set()  # calls in progress, whose next turn may start at any moment
        self.expected: dict[str, float] = {}  # calls whose caller may be finishing -> until when
        self.steps_planned = 0
        # what a step takes here, from the engine's own steps (and those of its last run here, where kept)
        self.costs = OnlineCost(kept_at=config.step_cost_file or None, save_every_s=config.step_cost_save_s)
        self.policy = make_policy(config.policy, self)

    def add(self, seq: Sequence, waits_for_grammar: bool = False) -> None:
        """A new request: waiting to be planned, or, while its grammar compiles, waiting for that first."""
        self.by_id[seq.request_id] = seq
        if waits_for_grammar:
            seq.status = Status.WAITING_FOR_GRAMMAR
        else:
            self.waiting.append(seq)

    def grammar_waiters(self, key: str | None = None) -> list[Sequence]:
        """The requests waiting for the grammar whose text is `key` (None: for any)."""
        return [s for s in self.by_id.values()
                if s.status is Status.WAITING_FOR_GRAMMAR and key in (None, s.params.grammar.key)]

    def grammar_ready(self, seq: Sequence) -> None:
        """Its grammar compiled: the request waits to be planned like any other."""
        seq.status = Status.WAITING
        self.waiting.append(seq)

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

    def expecting(self, now: float) -> bool:
        """Whether a caller may be finishing now (hints past their time are dropped)."""
        for session, until in list(self.expected.items()):
            if until <= now:
                del self.expected[session]
        return bool(self.expected)

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
        """The next step, as the policy plans it (most policies have `pack` do it)."""
        return self.policy.plan(time.monotonic() if now is None else now)

    def pack(self, now: float) -> StepPlan:
        """Continuous batching: sequences by the policy's priority while the budgets last, work other than
        realtime replies within the policy's share (by the step's predicted time, else by its tokens and
        sequences), each taking the chunk the policy sizes."""
        budget = self.policy.background(now)
        plan = StepPlan(rule=budget.rule)
        self.steps_planned += 1
        tokens_left, seqs_left = self.config.max_batch_tokens, self.config.max_batch_seqs
        timed = self.config.time_shares and budget.step_s < math.inf and self.costs.ready
        background_left, others_left = math.inf if timed else budget.prefill_tokens, budget.seqs
        tally = Tally()
        planned: set[int] = set()
        for seq in sorted(self.sequences, key=lambda s: self.policy.priority(s, now)):
            if tokens_left <= 0 or seqs_left <= 0:
                break
            # While a reply is pressing, nothing but realtime work; otherwise other prompts take a share, by
            # their own class: one aged into the realtime class goes first among them, not past the share.
            other = seq.cls > RequestClass.REALTIME
            background = seq.remaining_prefill > 1 and other
            if not budget.allowed and other or background and background_left <= 0 or other and others_left <= 0:
                continue
            if seq in plan.preempted or (seq.status is Status.WAITING and not self.admit(seq)):
                continue
            n = self.policy.chunk_size(seq, min(tokens_left, background_left) if background else tokens_left)
            if other and timed:
                fits = self._within(tally, seq, n, budget.step_s)
                if fits <= 0 and not plan.chunks:  # nothing fits, and the step is empty: the token share, so
                    fits = min(n, budget.prefill_tokens) if background else n  # work moves and steps are timed
                    fits = self.policy.chunk_size(seq, int(fits))
                n = fits
                if n <= 0:
                    continue
            if not self.grow(seq, n, plan, planned, now):
                continue
            plan.chunks.append(Chunk(seq, seq.num_cached, n))
            tally.add(seq.num_cached, n, seq.num_tokens)
            seq.last_step = self.steps_planned
            planned.add(id(seq))
            tokens_left -= n
            seqs_left -= 1
            others_left -= other
            if background:
                background_left -= n
        return plan

    def _within(self, tally: Tally, seq: Sequence, n: int, step_s: float) -> int:
        """The most of seq's n tokens (a chunk the policy would size) the step can take and still be predicted
        to end within `step_s`; 0 for none."""
        start, total = seq.num_cached, seq.num_tokens

        def fits(m: int) -> bool:
            return self.costs.predict(*tally.with_chunk(start, m, total)) <= step_s

        if fits(n):
            return n
        if n == 1 or not fits(1):
            return 0
        lo, hi = 1, n  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return self.policy.chunk_size(seq, lo)

    def admit(self, seq: Sequence) -> bool:
        """Start a waiting request if the pool can hold its prompt and its predicted output.

        Cached pages holding a prefix of its tokens (an earlier turn of the same call, a shared system
        prompt, or its own tokens before a preemption) are taken over instead of recomputed.
        """
        pool = self.pool
        seq.pages = pool.match_prefix(seq.cacheable)
        seq.num_cached = seq.reused = len(seq.pages) * pool.page_tokens
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

    def grow(self, seq: Sequence, n: int, plan: StepPlan, planned: set[int], now: float) -> bool:
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
        priority = self.policy.priority
        mine = priority(seq, now)
        candidates = [s for s in self.running if id(s) not in planned and s is not seq
                      and not self.pressing(s, now) and priority(s, now)[1:] > mine[1:]]
        return max(candidates, key=lambda s: priority(s, now)[1:], default=None)

    def preempt(self, seq: Sequence) -> None:
        """Recompute later: give back the pages (full ones stay cached), keep the tokens and the class."""
        self.pool.register(seq.pages, seq.page_keys)
        self.pool.release(seq.pages, int(seq.cls))
        seq.pages, seq.num_cached = [], 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.running.remove(seq)
        self.waiting.append(seq)

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
        """Release a finished sequence, unless the policy keeps it on as padding (a static batch, until it ends)."""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        self.by_id.pop(seq.request_id, None)
        self.output_lengths.append(len(seq.output_ids))
        if not self.policy.release_on_finish():
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

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """End a request before its time (the client's abort, a refusal, a fault), whatever its status."""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        self.by_id.pop(seq.request_id, None)
        self._release(seq)

    def check_pool(self) -> None:
        """AssertionError unless the pool's books balance against the pages the sequences hold."""
        self.pool.check([s.pages for s in self.sequences])
