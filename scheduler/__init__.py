"""mini-O4: a deadline-aware continuous-batching engine with a slab-paged KV cache.

The scheduler knows nothing of audio: voice turns reach it as REALTIME requests with deadlines, and ASR
and TTS calls as device jobs.
"""

from scheduler.config import KNOBS, EngineConfig
from scheduler.engine import Engine
from scheduler.kv_pool import PoolExhausted, SlabPool
from scheduler.request import Output, RequestClass, SamplingParams, Sequence

__all__ = ["KNOBS", "Engine", "EngineConfig", "Output", "PoolExhausted", "RequestClass", "SamplingParams", "Sequence",
           "SlabPool"]
