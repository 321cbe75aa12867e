"""Speech synthesis: each sentence of the reply becomes one REALTIME engine job."""

import asyncio
import logging
import time
from functools import partial

import numpy as np

from scheduler import Engine, RequestClass
from voicepipe.backends.base import TTS
from voicepipe.pipeline.events import (
    AudioOut,
    Error,
    Event,
    ResponseCreated,
    Sentence,
    TextDone,
    TurnCancelled,
    TurnDone,
)
from voicepipe.pipeline.pacing import Pacing
from voicepipe.pipeline.stage import Stage, device_call
from voicepipe.pipeline.turn import Turn

log = logging.getLogger(__name__)


class TTSStage(Stage):
    """Synthesizes a turn's sentences in order, each due when the caller's buffered audio runs out.

    A worker task per turn does the synthesis, so a cancellation passes through this stage at once; a
    sentence of a cancelled turn whose job has not started yet is never synthesized.
    """

    def __init__(self, engine: Engine, tts: TTS, pacing: Pacing) -> None:
        super().__init__()
        self.engine, self.tts, self.pacing = engine, tts, pacing
        self._turn: Turn | None = None
        self._queue: asyncio.Queue[Sentence | None] = asyncio.Queue()
        self._worker: asyncio.Task | None = None

    async def process(self, event: Event) -> None:
        if isinstance(event, (Sentence, TextDone)):
            if event.turn is self._turn:
                self._queue.put_nowait(event if isinstance(event, Sentence) else None)
                if isinstance(event, Sentence):
                    self.pacing.expect(event.turn, event.index, event.text)
            return
        if isinstance(event, ResponseCreated) or (isinstance(event, TurnCancelled) and event.turn is self._turn):
            if self._worker is not None:
                self._worker.cancel()
            self._turn, self._worker = None, None
        if isinstance(event, ResponseCreated):
            self._turn, self._queue = event.turn, asyncio.Queue()
            self._worker = self.spawn(self._speak(event.turn, self._queue))
        self.emit(event)

    async def _speak(self, turn: Turn, queue: "asyncio.Queue[Sentence | None]") -> None:
        while (sentence := await queue.get()) is not None:
            job = partial(self._synthesize, turn, sentence.text)
            try:
                # A speculative reply's sentences wait behind confirmed turns' realtime work.
                cls = RequestClass.INTERACTIVE if turn.speculative else RequestClass.REALTIME
                chunks, seconds = await device_call(self.engine, job, cls, self.pacing.tts_deadline(turn), "tts")
            except Exception:  # one sentence the voice cannot say must not silence the rest of the reply
                log.exception("synthesis failed for %r", sentence.text)
                self.emit(Error("tts_failed", "a sentence of the reply could not be synthesized", "server_error"))
                chunks, seconds = [], 0.0
            if turn.cancelled:
                return
            audio_s = sum(len(c) for c in chunks) / self.tts.sample_rate
            self.pacing.synthesized(turn, sentence.index, sentence.text, audio_s, seconds)
            for pcm in chunks:
                self.emit(AudioOut(turn, pcm, sentence.index))
        self.emit(TurnDone(turn))

    def _synthesize(self, turn: Turn, text: str) -> tuple[list[np.ndarray], float]:
        """Runs on the engine thread; returns the audio and how long it took."""
        if turn.cancelled:
            return [], 0.0
        start = time.perf_counter()
        chunks = [np.asarray(c, np.int16) for c in self.tts.synthesize(text) if len(c)]
        return chunks, time.perf_counter() - start
