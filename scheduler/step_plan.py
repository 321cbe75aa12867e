"""What one model step carries: a chunk of tokens per sequence, and the sequences it preempted."""

from dataclasses import dataclass, field

from scheduler.request import Sequence


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


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    rule: str = "open"  # the rule that bounded its background work (`policies.Background.rule`)

    @property
    def num_tokens(self) -> int:
        return sum(c.n for c in self.chunks)
