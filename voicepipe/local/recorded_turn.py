"""One whole spoken turn from a file, through the very pipeline a call uses: the recording is streamed
into a session as a caller's microphone would be, and the reply's text, audio and timings are collected.

So `voicepipe turn` and the notebook measure what a caller gets, not a sequential imitation of it.
"""

import asyncio
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from voicepipe.audio import SAMPLE_RATE, read_audio, to_pcm16
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.events import Event, TextDelta, TranscriptFinal
from voicepipe.pipeline.outbound import AudioSent, ResponseDone
from voicepipe.pipeline.turn import Mark
from voicepipe.protocol.transport import Disconnected

FRAME = SAMPLE_RATE // 50  # 20 ms, as a microphone sends
TRAILING_SILENCE_S = 2.0  # enough for the endpointer to hear the end of the question
E = TypeVar("E", bound=Event)


@dataclass
class TurnResult:
    """What one turn heard, answered and said.

    Timings are seconds from the end of the question's speech: `asr_s` to its final transcript,
    `tts_first_audio_s` to the first reply audio, `total_s` to the end of the reply; `llm_first_token_s`
    and `llm_total_s` count from the LLM request. Stages that did not run (nothing was heard) are None.
    """

    transcript: str
    answer: str
    audio: np.ndarray  # int16 mono
    sample_rate: int
    timings: dict[str, float | None]


class Recording:
    """The session's transport for a turn: the file's audio in, then silence; events and audio collected."""

    def __init__(self, audio: np.ndarray) -> None:
        pcm = to_pcm16(np.concatenate([audio, np.zeros(int(TRAILING_SILENCE_S * SAMPLE_RATE), np.float32)]))
        self._frames = deque(pcm[i:i + FRAME].tobytes() for i in range(0, len(pcm), FRAME))
        self.events: list[Event] = []
        self.audio: list[np.ndarray] = []
        self.over = asyncio.Event()

    async def recv(self) -> bytes:
        if self._frames:
            await asyncio.sleep(0)  # let the pipeline run between frames
            return self._frames.popleft()
        await self.over.wait()
        raise Disconnected()

    async def send(self, event: Event) -> None:
        if isinstance(event, AudioSent):
            self.audio.append(event.pcm)
            return
        self.events.append(event)
        if isinstance(event, ResponseDone):
            self.over.set()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.over.set()

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


async def run_turn(runtime: Runtime, wav_path: str | Path, config: CallConfig | None = None,
                   timeout_s: float = 600.0) -> TurnResult:
    """Hear the question in `wav_path`, answer it and speak the answer, as one turn of a call."""
    line = Recording(read_audio(wav_path, SAMPLE_RATE))
    session = Session(line, runtime, Limits(), config or CallConfig())
    try:
        await asyncio.wait_for(session.run(), timeout_s)
    except TimeoutError:
        pass
    heard = line.of(TranscriptFinal)
    answer = "".join(e.text for e in line.of(TextDelta))
    done = line.of(ResponseDone)
    audio = np.concatenate(line.audio) if line.audio else np.zeros(0, np.int16)
    return TurnResult(" ".join(e.text for e in heard).strip(), answer.strip(), audio,
                      runtime.tts_rate, stage_timings(done[-1].details["timings"] if done else {}))


def stage_timings(timings: dict[str, float]) -> dict[str, float | None]:
    """The turn's breakdown from the pipeline's own timings (seconds from the caller's last voiced frame)."""
    def at(stage: str) -> float | None:
        return timings.get(f"{stage}_s")

    def since_request(stage: str) -> float | None:
        value, start = at(stage), at(Mark.REPLY_STARTED)
        return None if value is None or start is None else value - start

    return {"asr_s": at(Mark.TRANSCRIPT), "llm_first_token_s": since_request(Mark.FIRST_TOKEN),
            "llm_total_s": since_request(Mark.TEXT_DONE), "tts_first_audio_s": at(Mark.FIRST_AUDIO),
            "total_s": at(Mark.DONE)}
