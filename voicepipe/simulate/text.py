"""Text traffic: requests of lengths drawn uniformly from ranges, arriving by a process or a trace.

Prompts are token ids that no two requests share a page of (two marker tokens, then filler), so the
prefix cache finds nothing across requests, as with random prompts, at a fraction of the cost of drawing
thousands of random ids per request. Every request runs to its drawn length (`ignore_eos`), as the benches'
random-weight requests do.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path

from scheduler import RequestClass, SamplingParams, Sequence
from scheduler.sim import Driver
from voicepipe.bench.workload import WorkItem

ARRIVALS = ("poisson", "burst", "all_at_once")
FILLER = 5


@dataclass(frozen=True, slots=True)
class TextLoad:
    arrivals: str = "poisson"
    rate: float = 1.0  # requests per second, on average (poisson, burst)
    duration_s: float = 60.0  # arrivals stop after this (poisson, burst)
    requests: int | None = None  # all_at_once: how many; poisson, burst: at most this many
    prompt_tokens: tuple[int, int] = (128, 2048)
    output_tokens: tuple[int, int] = (16, 256)
    burst_size: int = 32  # burst: requests arriving together, the groups a Poisson process
    seed: int = 0

    def items(self, vocab: int) -> list[WorkItem]:
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"unknown arrivals {self.arrivals!r} (choose from {', '.join(ARRIVALS)})")
        rng = random.Random(self.seed)
        items: list[WorkItem] = []
        clock = 0.0
        limit = self.requests if self.requests is not None else 1 << 62
        while len(items) < limit:
            if self.arrivals == "all_at_once":
                if self.requests is None:
                    raise ValueError("all_at_once needs a number of requests")
                group = 1
            else:
                group = self.burst_size if self.arrivals == "burst" else 1
                clock += rng.expovariate(self.rate / group)
                if clock > self.duration_s:
                    break
            for _ in range(min(group, limit - len(items))):
                n = rng.randint(*self.prompt_tokens)
                items.append(WorkItem(prompt_ids(len(items), n, vocab), rng.randint(*self.output_tokens), clock))
        return items

    def describe(self) -> dict:
        return {"arrivals": self.arrivals, "rate_per_s": self.rate, "duration_s": self.duration_s,
                "requests": self.requests, "prompt_tokens": list(self.prompt_tokens),
                "output_tokens": list(self.output_tokens), "seed": self.seed,
                **({"burst_size": self.burst_size} if self.arrivals == "burst" else {})}


# The seed article's experiment: inputs uniform over 128-2,048 tokens at 200 requests/s for 30 minutes.
# It gives no output lengths; these are the benches' (voicepipe.bench.workload: 16-256).
SEED = TextLoad("poisson", rate=200.0, duration_s=1800.0, prompt_tokens=(128, 2048), output_tokens=(16, 256))


def prompt_ids(number: int, length: int, vocab: int) -> list[int]:
    """A prompt of `length` tokens whose first page no other request's prompt has."""
    span = vocab - FILLER - 1
    marker = [FILLER + 1 + number % span, FILLER + 1 + (number // span) % span]
    return (marker + [FILLER] * max(0, length - 2))[:length]


def trace_items(path: str | Path, vocab: int) -> list[WorkItem]:
    """A trace: JSON lines of {"arrival_s", "prompt_tokens", "output_tokens"} (numbers: lengths only)."""
    items = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            items.append(WorkItem(prompt_ids(len(items), int(row["prompt_tokens"]), vocab), int(row["output_tokens"]),
                                  float(row["arrival_s"])))
    return sorted(items, key=lambda w: w.arrival_s)


def submit_text(driver: Driver, items: list[WorkItem], cls: RequestClass = RequestClass.INTERACTIVE,
                label: str = "text") -> list[Sequence]:
    """Schedule each item's request at its arrival; the list fills as they arrive."""
    seqs: list[Sequence] = []

    def arrive(number: int, item: WorkItem) -> None:
        seq = Sequence(item.prompt_ids, SamplingParams(max_tokens=item.max_tokens, ignore_eos=True), cls,
                       request_id=f"{label}-{number}")
        seq.arrival = driver.start + item.arrival_s
        seqs.append(driver.add_request(seq))

    for number, item in enumerate(items):
        driver.at(item.arrival_s, lambda n=number, w=item: arrive(n, w))
    return seqs
