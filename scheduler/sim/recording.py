"""A real model runner that notes the shape of each step it runs: what a fit of measured steps reads."""

import torch

from scheduler.planner import StepPlan
from scheduler.step_shape import StepShape


class RecordingRunner:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.num_slabs, self.pages_per_slab = runner.num_slabs, runner.pages_per_slab
        self.shapes: list[StepShape] = []

    def run(self, plan: StepPlan) -> torch.Tensor:
        self.shapes.append(StepShape.of(plan))
        return self.runner.run(plan)

    def copy_pages(self, moves: dict[int, int]) -> None:
        self.runner.copy_pages(moves)
