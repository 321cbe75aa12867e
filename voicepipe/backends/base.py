"""The three model interfaces, and the helpers every LLM backend shares.

The interfaces are small on purpose: the pipeline only needs text out of audio, text deltas out of a chat, and
audio chunks out of text. ASR and TTS are synchronous because their device work runs as jobs on the
engine's single device thread; the LLM is asynchronous because its tokens arrive over many engine steps.
"""

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass
class GenerationParams:
    """How to sample an answer; temperature 0 means greedy, the reproducible default."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)


class ASR(Protocol):
    """Speech to text for one utterance."""

    sample_rate: int  # 16000 for Whisper

    def transcribe(self, audio: np.ndarray) -> str:
        """Transcribe float32 mono audio at `sample_rate`."""
        ...


class TTS(Protocol):
    """Text to speech, streamed so playback can start after the first sentence."""

    sample_rate: int

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield int16 mono chunks at `sample_rate`, at least one per sentence."""
        ...


class LLM(Protocol):
    """A chat model that streams its answer."""

    def stream(self, messages: list[dict[str, str]], params: GenerationParams) -> AsyncIterator[str]:
        """Yield the answer to `messages` (dicts with "role" and "content") as text deltas."""
        ...


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat template over `messages`, ending with the assistant's turn opener.

    `return_dict=False` because transformers 5 returns a BatchEncoding by default, where 4.x returned ids.
    """
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return [int(i) for i in ids]
