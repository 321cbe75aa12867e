"""The three stage interfaces, and the helpers every LLM backend shares.

Stages are small on purpose: the pipeline only needs text out of audio, text deltas out of a chat, and
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


class StopScanner:
    """Cuts a stream of text deltas at the first stop string.

    A stop string may arrive split over several deltas, so the tail of the text that could still begin
    one is held back until the next delta shows whether it does.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.stopped = False
        self._pending = ""

    def feed(self, delta: str) -> str:
        """Add a delta; return the text that is now safe to emit. Sets `stopped` on a stop string."""
        if self.stopped:
            return ""
        text = self._pending + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)]
        longest = max((len(s) for s in self.stops), default=0)
        keep = 0
        for k in range(min(len(text), longest - 1), 0, -1):
            if any(s.startswith(text[-k:]) for s in self.stops):
                keep = k
                break
        self._pending = text[len(text) - keep:]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back text, at the end of the stream."""
        text, self._pending = ("" if self.stopped else self._pending), ""
        return text
