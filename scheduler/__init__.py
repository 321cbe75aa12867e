"""mini-O4: a deadline-aware continuous-batching engine with a slab-paged KV cache.

The scheduler knows nothing of audio: voice turns reach it as REALTIME requests with deadlines, and ASR
and TTS calls as device jobs. `Engine` loads on first use (it imports torch), so the settings, requests
and the pool can be read by a command line that has not decided to load a model yet.
"""

from typing import TYPE_CHECKING

from scheduler.config import KNOBS, EngineConfig
from scheduler.kv_pool import PoolExhausted, SlabPool
from scheduler.request import Output, RequestClass, SamplingParams, Sequence

if TYPE_CHECKING:
    from scheduler.engine import Engine

__all__ = ["KNOBS", "Engine", "EngineConfig", "Output", "PoolExhausted", "RequestClass", "SamplingParams", "Sequence",
           "SlabPool"]


def __getattr__(name: str):
    if name == "Engine":
        from scheduler.engine import Engine

        return Engine
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
