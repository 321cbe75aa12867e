"""The model runner's stand-in: it prices a step instead of running it, and builds the real engine on it.

The pool it sizes holds page numbers only (the real runner's tensors are what would take the memory), so
a 60 GB KV cache of a 13B model is a few thousand slabs of bookkeeping. Sampled tokens are a fixed id: the
simulated requests ignore the end token and run to their lengths, as the benches' random-weight models do.
"""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Protocol

import torch

from scheduler.config import EngineConfig
from scheduler.engine import Engine
from scheduler.job_lane import Batch, Refill, run_jobs
from scheduler.jobs import Job, JobHandler, JobResult
from scheduler.model.kv_dtype import num_slabs, pages_per_slab
from scheduler.planner import StepPlan
from scheduler.sim.clock import VirtualClock
from scheduler.sim.shape import ModelShape
from scheduler.step_shape import StepShape

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


PricedJob = Callable[..., tuple[float, object]] | JobHandler


def virtual_engine(shape: ModelShape, config: EngineConfig, cost: StepCost, tokenizer,
                   jobs: dict[str, PricedJob] | None = None, kv_itemsize: int = 2,
                   clock: VirtualClock | None = None) -> Engine:
    """The real engine on a virtual clock and a priced runner. Each job kind's function returns (seconds it
    takes on the device, its value), or, as a handler with a `batch`, (seconds of the whole run, the values)
    for a list of jobs' arguments: the engine runs it between steps, by its own rules, and the clock moves
    on by those seconds; or, with `config.job_threads`, on a lane beside the steps (a GPU's second stream),
    done when the clock reaches its start plus those seconds."""
    clock = clock or VirtualClock()
    runner = PricedRunner(shape, config, cost, clock, kv_itemsize)
    lane = VirtualLane(clock) if config.job_threads else None
    handlers = {kind: priced_handler(job, lane.timer if lane else clock) for kind, job in (jobs or {}).items()}
    # What the engine reads of a model besides running it: its vocabulary and how far its positions reach.
    described = SimpleNamespace(config=SimpleNamespace(vocab_size=shape.vocab,
                                                       max_position_embeddings=shape.max_positions))
    return Engine(described, tokenizer, config, handlers, runner=runner, clock=clock.now, lane=lane)


class Advancing(Protocol):
    """What a priced job moves on by its price: the virtual clock, the lane's timer, a bench's stand-in."""

    def advance(self, seconds: float) -> None: ...


def priced_handler(job: PricedJob, clock: Advancing) -> JobHandler:
    """A priced job's handler: it moves `clock` on by the price (`advance`) and returns the value(s)."""
    handler = job if isinstance(job, JobHandler) else JobHandler(job)

    def run(*args):
        seconds, value = handler.fn(*args)
        clock.advance(seconds)
        return value

    return JobHandler(run, handler.batch)


class VirtualLane:
    """The job lane on the virtual clock: a batch is run at once for its values, its handlers moving the
    lane's own `timer` by their price, and its results come out once the clock reaches its end; the next
    batch waiting (`refill`) starts at that end, as on a thread of its own."""

    beside = True

    def __init__(self, clock: VirtualClock) -> None:
        self.clock, self.timer = clock, VirtualClock()
        self.refill: Refill = lambda: None
        self._running: tuple[float, list[JobResult]] | None = None  # (when it ends, its results)
        self._done: list[JobResult] = []

    @property
    def busy(self) -> bool:
        self._settle()
        return self._running is not None

    def start(self, jobs: list[Job], handler: JobHandler) -> None:
        self._run((jobs, handler), self.clock.now())

    def take(self) -> list[JobResult]:
        self._settle()
        done, self._done = self._done, []
        return done

    def wait(self, timeout_s: float) -> None:
        if self._running is not None:
            self.clock.wait_until(min(self._running[0], self.clock.now() + timeout_s))

    def close(self) -> None:
        """No thread to stop."""

    def _run(self, batch: Batch, at: float) -> None:
        started = self.timer.now()
        results = run_jobs(*batch, self.timer.now)
        self._running = (at + self.timer.now() - started, results)

    def _settle(self) -> None:
        while self._running is not None and self.clock.now() >= self._running[0]:
            ended, results = self._running
            self._done += results
            self._running = None
            batch = self.refill()
            if batch is not None:
                self._run(batch, ended)
