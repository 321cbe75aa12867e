"""Next-token choice: greedy at temperature 0 (the exactness oracle's setting), else top-p sampling."""

import torch

from scheduler.request import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> list[int]:
    """One token per row of a step's logits [rows, vocab]; `positions` counts each row's output so far.

    The greedy rows, usually all of them, take one argmax and one copy to the host for the whole step
    rather than one each; only rows that sample pay for a softmax of their own. A row with a seed draws
    from a generator seeded by (seed, position), so the same request gives the same answer however it
    was batched or preempted.
    """
    tokens = torch.argmax(logits, dim=-1).tolist()
    for row, p in enumerate(params):
        if p.temperature > 0:
            generator = None
            if p.seed is not None:
                generator = torch.Generator().manual_seed((p.seed * 1_000_003 + positions[row]) % 2**63)
            tokens[row] = sample(logits[row], p, generator)
    return tokens


def probability_of(logits: torch.Tensor, tokens: tuple[int, ...]) -> float:
    """The probability that the next token is one of `tokens`, under the model's own distribution
    (temperature 1)."""
    wanted = [t for t in tokens if t < logits.shape[-1]]
    return float(torch.softmax(logits, dim=-1)[wanted].sum())


def probe_rows(logits: torch.Tensor, params: list[SamplingParams]) -> list[float | None]:
    """Per sampled row, its probe (`probe`); None for rows without one, or whose probe is read at a prompt
    position instead (`probe_at`)."""
    return [probability_of(logits[row], p.probe_tokens) if p.probe_tokens and p.probe_at is None else None
            for row, p in enumerate(params)]
