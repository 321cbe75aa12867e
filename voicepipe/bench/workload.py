"""The fixed LLM workload every engine mode is measured on: same prompts, lengths and arrivals."""

import random
from dataclasses import dataclass

from voicepipe.backends.base import chat_prompt_ids

TOPICS = ["the history of bridges", "how bees find flowers", "a trip to the mountains", "making bread at home",
          "the planets of the solar system", "learning to play the piano", "why leaves change colour",
          "a day at a busy train station", "how a refrigerator works", "the life of a lighthouse keeper"]
FILLER = ("Please answer carefully and in plain words, with an example where it helps, and keep in mind that "
          "the reader is curious but new to the subject and would like to understand each step of the idea. ")


@dataclass(frozen=True, slots=True)
class WorkItem:
    prompt_ids: list[int]
    max_tokens: int
    arrival_s: float  # offset from the start of the run


@dataclass(frozen=True, slots=True)
class Workload:
    requests: int = 32
    prompt_tokens: tuple[int, int] = (32, 256)
    output_tokens: tuple[int, int] = (16, 256)
    poisson_rate: float | None = None  # requests per second; None: all arrive at once
    seed: int = 0

    def describe(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": list(self.prompt_tokens),
                "output_tokens": list(self.output_tokens), "poisson_rate_per_s": self.poisson_rate,
                "seed": self.seed}

    def items(self, tokenizer) -> list[WorkItem]:
        rng = random.Random(self.seed)
        items, clock = [], 0.0
        for i in range(self.requests):
            target = rng.randint(*self.prompt_tokens)
            topic = TOPICS[i % len(TOPICS)]
            text = f"Tell me about {topic}. " + FILLER * 8
            ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
            overhead = len(ids) - len(tokenizer.encode(text, add_special_tokens=False))
            body = tokenizer.encode(text, add_special_tokens=False)[:max(1, target - overhead)]
            ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": tokenizer.decode(body)}])
            if self.poisson_rate:
                clock += rng.expovariate(self.poisson_rate)
            items.append(WorkItem(ids, rng.randint(*self.output_tokens), clock))
        return items

    def token_items(self, vocab_size: int) -> list[WorkItem]:
        """The same lengths and arrivals as `items`, with random token ids for prompts: for models without
        a vocabulary (random weights), where only the lengths matter."""
        rng, ids_rng = random.Random(self.seed), random.Random(self.seed + 1)
        items, clock = [], 0.0
        for _ in range(self.requests):
            prompt = [ids_rng.randrange(3, vocab_size) for _ in range(rng.randint(*self.prompt_tokens))]
            if self.poisson_rate:
                clock += rng.expovariate(self.poisson_rate)
            items.append(WorkItem(prompt, rng.randint(*self.output_tokens), clock))
        return items


@dataclass(frozen=True, slots=True)
class ApiLoad:
    """The text API traffic `bench mixed` runs beside the calls: streams of long-prompt chat completions."""

    streams: int = 16
    prompt_tokens: int = 600
    max_tokens: int = 64
    alone_s: float = 60.0  # how long API throughput is measured without calls
