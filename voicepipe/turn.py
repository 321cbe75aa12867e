"""One whole spoken turn from a file: speech to text, text to answer, answer to speech, with timings.

The answer goes to TTS sentence by sentence as the LLM writes it, so the first audio is ready long
before the answer is finished, as it would be for a caller.
"""

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicepipe.audio import read_audio
from voicepipe.backends.base import ASR, LLM, TTS, GenerationParams
from voicepipe.instructions import DEFAULT_INSTRUCTIONS
from voicepipe.sentence_split import split_ready


def build_messages(user_text: str, system_prompt: str = DEFAULT_INSTRUCTIONS) -> list[dict[str, str]]:
    """The chat for one question. An empty system prompt sends no system message at all, so the prompt
    is exactly the model's chat template over the user's words (with whatever default it supplies)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": user_text}]


class SentenceBuffer:
    """Collects text deltas and releases whole sentences, the unit TTS speaks (cut as a call's are)."""

    def __init__(self) -> None:
        self._text = ""

    def feed(self, delta: str) -> list[str]:
        """Add a delta; return the sentences it completed."""
        done, self._text = split_ready(self._text + delta, clause_chars=None)
        return done

    def flush(self) -> str:
        """The unfinished last sentence, at the end of the answer."""
        text, self._text = self._text.strip(), ""
        return text


@dataclass
class TurnResult:
    """What one turn heard, answered and said.

    Timings are in seconds: `asr_s` is the ASR pass (file reading included); `llm_first_token_s` and
    `llm_total_s` count from the LLM request; `tts_first_audio_s` and `total_s` count from the start of
    the turn, which for a file is the end of the user's speech. Stages that did not run (nothing was
    heard) have None.
    """

    transcript: str
    answer: str
    audio: np.ndarray  # int16 mono
    sample_rate: int
    timings: dict[str, float | None]


async def run_turn(wav_path: str | Path, asr: ASR, llm: LLM, tts: TTS, params: GenerationParams,
                   system_prompt: str = DEFAULT_INSTRUCTIONS) -> TurnResult:
    """Hear the question in `wav_path`, answer it and speak the answer."""
    start = time.perf_counter()
    transcript = asr.transcribe(read_audio(wav_path, asr.sample_rate))
    llm_start = time.perf_counter()
    timings: dict[str, float | None] = dict.fromkeys(
        ("asr_s", "llm_first_token_s", "llm_total_s", "tts_first_audio_s", "total_s"))
    timings["asr_s"] = llm_start - start
    chunks: list[np.ndarray] = []
    answer: list[str] = []
    if transcript:
        sentences: asyncio.Queue[str | None] = asyncio.Queue()

        async def speak() -> None:
            """Synthesize queued sentences off the event loop, so LLM deltas keep being timed."""
            while (sentence := await sentences.get()) is not None:
                pieces = iter(tts.synthesize(sentence))
                while (chunk := await asyncio.to_thread(next, pieces, None)) is not None:
                    if not chunks:
                        timings["tts_first_audio_s"] = time.perf_counter() - start
                    chunks.append(chunk)

        speaker = asyncio.create_task(speak())
        try:
            buffer = SentenceBuffer()
            async for delta in llm.stream(build_messages(transcript, system_prompt), params):
                if timings["llm_first_token_s"] is None:
                    timings["llm_first_token_s"] = time.perf_counter() - llm_start
                answer.append(delta)
                for sentence in buffer.feed(delta):
                    sentences.put_nowait(sentence)
            timings["llm_total_s"] = time.perf_counter() - llm_start
            last = buffer.flush()
            if last:
                sentences.put_nowait(last)
            sentences.put_nowait(None)
            await speaker
        finally:
            speaker.cancel()
    timings["total_s"] = time.perf_counter() - start
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return TurnResult(transcript, "".join(answer).strip(), audio.astype(np.int16, copy=False),
                      tts.sample_rate, timings)
