"""The model runner's stand-in: it prices a step instead of running it, and builds the real engine on it.

The pool it sizes holds page numbers only (the real runner's tensors are what would take the memory), so
a 60 GB KV cache of a 13B model is a few thousand slabs of bookkeeping. Sampled tokens are a fixed id: the
simulated requests ignore the end token and run to their lengths, as the benches' random-weight models do.
"""

from collections.abc import Callable
from types import SimpleNamespace

import torch

from scheduler.config import EngineConfig
from scheduler.engine import Engine
from scheduler.jobs import JobHandler
from scheduler.model.kv_dtype import num_slabs, pages_per_slab
from scheduler.planner import StepPlan
from scheduler.sim.clock import VirtualClock
from scheduler.sim.shape import ModelShape
from scheduler.sim.step_shape import StepShape

TOKEN = 3  # what every simulated step samples: not an end token, not padding


class StepCost:
    """What prices a step (`Roofline`, `FittedCost`)."""

    def step_seconds(self, step: StepShape) -> float:
        raise NotImplementedError


class PricedRunner:
    """Each step moves the virtual clock on by its price; `steps` keeps (shape, seconds) for the report."""

    def __init__(self, shape: ModelShape, config: EngineConfig, cost: StepCost, clock: VirtualClock,
                 kv_itemsize: int = 2):
        self.cost, self.clock = cost, clock
        self.pages_per_slab = pages_per_slab(config.slab_bytes, config.page_tokens, shape.kv_heads, shape.head_dim,
                                             _itemsize_dtype(kv_itemsize))
        self.num_slabs = num_slabs(config, shape.layers)
        self.steps: list[tuple[StepShape, float]] = []

    def run(self, plan: StepPlan) -> torch.Tensor:
        step = StepShape.of(plan)
        seconds = self.cost.step_seconds(step)
        self.clock.advance(seconds)
        self.steps.append((step, seconds))
        logits = torch.zeros(step.samples, TOKEN + 1)
        logits[:, TOKEN] = 1.0
        return logits

    def copy_pages(self, moves: dict[int, int]) -> None:
        """Compaction moves page numbers only; its copy is not priced (a few MB between steps)."""


def _itemsize_dtype(itemsize: int) -> torch.dtype:
    return {1: torch.float8_e4m3fn, 2: torch.float16, 4: torch.float32}[itemsize]


def virtual_engine(shape: ModelShape, config: EngineConfig, cost: StepCost, tokenizer,
                   jobs: dict[str, Callable[..., tuple[float, object]]] | None = None, kv_itemsize: int = 2,
                   clock: VirtualClock | None = None) -> Engine:
    """The real engine on a virtual clock and a priced runner. Each job kind's function returns (seconds it
    takes on the device, its value): the engine runs it between steps, by its own rules, and the clock moves
    on by those seconds."""
    clock = clock or VirtualClock()
    runner = PricedRunner(shape, config, cost, clock, kv_itemsize)
    handlers = {kind: JobHandler(_priced(fn, clock)) for kind, fn in (jobs or {}).items()}
    # What the engine reads of a model besides running it: its vocabulary and how far its positions reach.
    described = SimpleNamespace(config=SimpleNamespace(vocab_size=shape.vocab,
                                                       max_position_embeddings=shape.max_positions))
    return Engine(described, tokenizer, config, handlers, runner=runner, clock=clock.now)


def _priced(fn: Callable[..., tuple[float, object]], clock: VirtualClock) -> Callable[..., object]:
    def run(*args):
        seconds, value = fn(*args)
        clock.advance(seconds)
        return value

    return run
