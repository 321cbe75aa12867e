"""What one planned step asks of the device, counted from the planner's own plan."""

from dataclasses import asdict, dataclass

from scheduler.planner import StepPlan


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
        tokens = samples = decodes = prefill = pairs = context = 0
        for chunk in plan.chunks:
            n, start = chunk.n, chunk.start
            tokens += n
            samples += chunk.samples
            if chunk.kind == "decode":
                decodes += 1
            else:
                prefill += n
            pairs += n * start + n * (n + 1) // 2
            context += start + n
        return cls(tokens, len(plan.chunks), samples, decodes, prefill, pairs, context)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
