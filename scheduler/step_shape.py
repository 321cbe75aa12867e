"""What one planned step asks of the device, counted from the planner's own plan."""

from dataclasses import asdict, dataclass

from scheduler.step_plan import StepPlan


@dataclass(frozen=True, slots=True)
class StepShape:
    """The counts a step's cost depends on, whatever the model.

    `attention_pairs` counts (query, key) pairs over the step's chunks: a chunk of n tokens starting at
    position s attends to s+1, ..., s+n keys (causal), n*s + n(n+1)/2 in all. `context_tokens` counts the
    keys and values each chunk reads from the cache once (its whole context, s + n).
    """

    tokens: int
    seqs: int
    samples: int  # rows that sample a token: they alone go through the output head
    decodes: int
    prefill_tokens: int
    attention_pairs: int
    context_tokens: int

    @classmethod
    def of(cls, plan: StepPlan) -> "StepShape":
        tally, decodes = Tally(), 0
        for chunk in plan.chunks:
            tally.add(chunk.start, chunk.n, chunk.seq.num_tokens)
            decodes += chunk.kind == "decode"
        return cls(tally.tokens, tally.seqs, tally.samples, decodes, tally.tokens - decodes, tally.pairs,
                   tally.context)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Tally:
    """A step's counts as the planner packs it, one chunk at a time: what its cost model prices."""

    __slots__ = ("tokens", "samples", "seqs", "pairs", "context")

    def __init__(self) -> None:
        self.tokens = self.samples = self.seqs = self.pairs = self.context = 0

    def with_chunk(self, start: int, n: int, total: int) -> tuple[int, int, int, int, int]:
        """The counts with one more chunk of n tokens from `start` of a sequence of `total` tokens: (tokens,
        samples, seqs, attention pairs, context tokens), as `OnlineCost.predict` takes them."""
        return (self.tokens + n, self.samples + (start + n == total), self.seqs + 1,
                self.pairs + n * start + n * (n + 1) // 2, self.context + start + n)

    def add(self, start: int, n: int, total: int) -> None:
        self.tokens, self.samples, self.seqs, self.pairs, self.context = self.with_chunk(start, n, total)
