"""One call's pipeline stages and what they share: typed events, the turn record, the conversation, pacing.
The stages are put together as a list in `voicepipe.call.pipeline.build_pipeline`."""

from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation

__all__ = ["CallConfig", "Conversation"]
