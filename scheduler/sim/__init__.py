"""The simulator's core: the engine's own planner, pool and job queue in virtual time.

Nothing here copies a scheduling rule. `virtual_engine` builds the real `Engine` with two parts swapped:
its clock is a `VirtualClock`, and its model runner is a `PricedRunner`, which prices each planned step
with a cost model (`Roofline` from a model's shape and a device's published rates, or `FittedCost` from
step times measured on a device at hand) and moves the clock on by that much. `Driver` feeds it timed
work (arrivals, a call's next turn) as the benches feed the real engine, so one driver runs both.
"""

import importlib
from typing import TYPE_CHECKING

from scheduler.sim.clock import ThreadClock, VirtualClock, WallClock
from scheduler.sim.devices import DEVICES, DTYPES, Device, DType
from scheduler.sim.roofline import Efficiency, Roofline
from scheduler.sim.shape import ModelShape
from scheduler.step_cost import FittedCost
from scheduler.step_shape import StepShape

if TYPE_CHECKING:
    from scheduler.sim.drive import Driver, Saturated
    from scheduler.sim.recording import RecordingRunner
    from scheduler.sim.runner import PricedRunner, priced_handler, virtual_engine

# These import torch (through the engine): loaded on first use, so that a command line can read the devices
# and the cost models without it.
_LAZY = {"Driver": "drive", "Saturated": "drive", "RecordingRunner": "recording", "PricedRunner": "runner",
         "priced_handler": "runner", "virtual_engine": "runner"}

__all__ = ["DEVICES", "DTYPES", "DType", "Device", "Driver", "Efficiency", "FittedCost", "ModelShape", "PricedRunner",
           "RecordingRunner", "Roofline", "Saturated", "StepShape", "ThreadClock", "VirtualClock", "WallClock",
           "priced_handler", "virtual_engine"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"scheduler.sim.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'scheduler.sim' has no attribute {name!r}")
