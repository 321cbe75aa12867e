"""Scheduling policies: the decisions the step planner asks of one, and the registry of their names.

The planner packs every step the same way (the two budgets, admission, pages, preemption); a policy
decides the order it serves sequences in (`priority`), what a step may give to work other than realtime
replies (`background`), how much of a prompt one step takes (`chunk_size`), whether it plans its steps
itself (`plan`: static batches) and when a finished sequence's pages go back (`release_on_finish`).

Adding a policy is a subclass of `Policy` and a line in `POLICIES`: the planner builds its policy by name
from there (`make_policy`), and the command line's choices, the server's settings and the benches read
the names from there too.
"""

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

from scheduler.config import EngineConfig
from scheduler.kv_pool import PoolExhausted
from scheduler.request import RequestClass, Sequence, Status
from scheduler.step_plan import Chunk, StepPlan


@dataclass(frozen=True, slots=True)
class Background:
    """What one step may give to work other than realtime replies."""

    allowed: bool = True  # False while a reply is pressing: the step carries realtime work alone
    prefill_tokens: float = math.inf  # the share of the step non-realtime prompts may take
    seqs: float = math.inf  # the non-realtime sequences the step may carry
    step_s: float = math.inf  # by time: how long the step may be predicted to last with them (the shares' stead)
    rule: str = "open"  # which rule set the share, for the step trace


REALTIME_ONLY = Background(allowed=False, prefill_tokens=0, seqs=0, rule="pressing")

# What a sequence asks of a step, in the order o4 serves it (before its class and deadline).
PRESSING_DECODE, DECODE, PREFILL = 0, 1, 2


class Planner(Protocol):
    """What a policy reads of the planner it serves (`StepPlanner`): its queues, its calls, its config."""

    config: EngineConfig
    running: list[Sequence]
    waiting: list[Sequence]
    live_sessions: set[str]

    @property
    def sequences(self) -> list[Sequence]:
        """Running, then waiting."""

    def pressing(self, seq: Sequence, now: float) -> bool:
        """A realtime request whose deadline is within the pressing window."""

    def effective_class(self, seq: Sequence, now: float) -> int:
        """Its class, aged by its wait."""

    def expecting(self, now: float) -> bool:
        """Whether a call's caller may be finishing their turn now."""

    def pack(self, now: float) -> StepPlan:
        """Continuous batching by the policy's answers."""

    def admit(self, seq: Sequence) -> bool:
        """Start a waiting request if the pool can hold it."""

    def grow(self, seq: Sequence, n: int, plan: StepPlan, planned: set[int], now: float) -> bool:
        """Pages for n more of seq's tokens, preempting lower-priority work if need be."""


class Policy:
    """A policy reads the planner it serves and answers what it asks."""

    # Whether it may serve live calls: one whose steps make a new turn wait long is a bench baseline only.
    serves_calls: ClassVar[bool] = True
    about: ClassVar[str] = ""  # a few words for the command line's help

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def priority(self, seq: Sequence, now: float) -> tuple:
        """The key the planner sorts sequences by, lowest first. Its first element says what the sequence
        asks of the step; a victim of preemption is chosen by the rest (who it is, not what it does next)."""
        raise NotImplementedError

    def background(self, now: float) -> Background:
        """What this step may give to work other than realtime replies: everything, unless a policy says."""
        return Background()

    def chunk_size(self, seq: Sequence, tokens_left: int) -> int:
        """How many of seq's tokens this step carries: as many as the budget left allows."""
        return min(seq.remaining_prefill, tokens_left)

    def plan(self, now: float) -> StepPlan:
        """The next step: the planner packs it by this policy's priority, background share and chunk size."""
        return self.planner.pack(now)

    def release_on_finish(self) -> bool:
        """Whether a finished sequence's pages go back at once (else it stays on, as padding)."""
        return True


class FirstComeFirstServed(Policy):
    """Continuous batching without classes, as vLLM schedules by default: running first, then waiting, by
    arrival; chunks as large as the budget allows."""

    about = "plain continuous batching"

    def priority(self, seq: Sequence, now: float) -> tuple:
        return (seq.status is not Status.RUNNING, seq.arrival)


class O4(Policy):
    """mini-O4: pressing realtime decodes, other running decodes, then prefill shards by (aged) class and
    deadline, a prompt taking whole shards of `shard_tokens` while the token budget lasts.

    What a step may give to other work than realtime replies (`background`, the first rule that holds; the
    step trace names it):
    - `pressing`: a realtime reply is pressing: the step carries realtime work alone; a step's time grows
      with every sequence in it, so a reply about to miss its deadline gets the device's shortest steps.
    - `deadline_near`: a realtime deadline is within two pressing windows: other work keeps a step within
      `deadline_near_step_s` (by tokens: other prefill takes at most `realtime_prefill_tokens` of it).
    - `expecting`: a caller may be finishing their turn (`expect`: their VAD heard the first silence, until
      the turn's first audio or its deadline): other work keeps a step within `expect_step_s` (by tokens:
      at most `expect_background_seqs` other sequences and `expect_prefill_tokens` of other prefill). The
      end-of-turn ASR pass and the reply's prefill each wait first for the step in flight, and a wide
      decode batch beside a long prompt is the longest step there is. Decodes take turns (the one that
      waited longest goes first), so each stream slows a little rather than some stopping.
    - `live_call`: calls are live: other work keeps a step within `live_step_s` (by tokens: other prefill
      takes at most `live_prefill_tokens` of it), so a turn that begins does not first wait out a long step.
    - `open`: everything.
    The prefill share goes by a request's own class, so an aged prompt goes first among the others but does
    not take a live call's short steps away. By time (`time_shares`), the same rules hold on any device:
    a step's seconds are what a turn waits, whatever a token costs there.
    """

    about = "deadline-aware"

    def priority(self, seq: Sequence, now: float) -> tuple:
        planner = self.planner
        decoding = seq.status is Status.RUNNING and seq.remaining_prefill == 1
        work = PRESSING_DECODE if decoding and planner.pressing(seq, now) else DECODE if decoding else PREFILL
        deadline = seq.deadline if seq.deadline is not None else math.inf
        # Decodes take turns by the step that last carried them, so steps that cannot carry them all rotate.
        return (work, planner.effective_class(seq, now), deadline, seq.last_step if decoding else seq.arrival)

    def background(self, now: float) -> Background:
        """All of it, unless a realtime request's deadline approaches (within two pressing windows), whose
        next tokens would otherwise wait behind long steps; nothing at all, decodes included, while one is
        pressing. A reply whose caller has seconds of audio buffered slows nobody down."""
        planner, config = self.planner, self.planner.config
        slack = min((s.deadline - now for s in planner.sequences
                     if s.cls is RequestClass.REALTIME and s.deadline is not None), default=math.inf)
        if slack <= config.pressing_window_s:
            return REALTIME_ONLY
        if slack <= 2 * config.pressing_window_s:
            return Background(prefill_tokens=config.realtime_prefill_tokens, step_s=config.deadline_near_step_s,
                              rule="deadline_near")
        if planner.expecting(now):  # a caller may be finishing: their turn's first work is about to arrive
            return Background(prefill_tokens=config.expect_prefill_tokens, seqs=config.expect_background_seqs,
                              step_s=config.expect_step_s, rule="expecting")
        # A turn may begin at any moment of a live call, and waits first for the step in flight.
        if planner.live_sessions:
            return Background(prefill_tokens=config.live_prefill_tokens, step_s=config.live_step_s,
                              rule="live_call")
        return Background()

    def chunk_size(self, seq: Sequence, tokens_left: int) -> int:
        """Whole shards while the budget lasts.

        A sequence may take several shards in one step once everything ahead of it is packed: decodes
        never wait behind a prompt (they are packed first), and the most urgent prompt finishes sooner
        than if every prompt crept forward one shard a step.
        """
        n = super().chunk_size(seq, tokens_left)
        shard = self.planner.config.shard_tokens
        if shard <= n < seq.remaining_prefill:
            n -= n % shard
        return n


class Static(FirstComeFirstServed):
    """Fixed batches that wait for their longest member, as plain `generate` batches: admitted together by
    arrival, prefilled whole, decoded until the last one ends (the others stay on as padding)."""

    serves_calls = False  # a new turn would wait for the whole batch in front of it
    about = "fixed batches"

    def plan(self, now: float) -> StepPlan:
        planner, plan = self.planner, StepPlan()
        if not planner.running:
            for seq in sorted(planner.waiting, key=lambda s: s.arrival)[:planner.config.static_batch_size]:
                if not planner.admit(seq):
                    break
        for seq in planner.running:
            if not planner.grow(seq, seq.remaining_prefill, plan, set(), 0.0):
                raise PoolExhausted("a static batch outgrew the KV pool: lower static_batch_size")
            plan.chunks.append(Chunk(seq, seq.num_cached, seq.remaining_prefill))
        return plan

    def release_on_finish(self) -> bool:
        return not any(s.status is Status.RUNNING for s in self.planner.running)


# The policies by name, the default (`config.DEFAULT_POLICY`) first. A new policy: its class above and one
# line here.
POLICIES: dict[str, type[Policy]] = {
    "o4": O4,
    "fcfs": FirstComeFirstServed,
    "static": Static,
}


def make_policy(name: str, planner: Planner) -> Policy:
    """The policy of that name, serving `planner`; ValueError for a name the registry lacks."""
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {name!r}")
    return POLICIES[name](planner)


def call_policies() -> tuple[str, ...]:
    """The names of the policies that may serve live calls (`serve`, `talk`, the call benches)."""
    return tuple(name for name, policy in POLICIES.items() if policy.serves_calls)
