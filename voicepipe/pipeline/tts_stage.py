"""Speech synthesis: each sentence of the reply becomes one REALTIME engine job."""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from scheduler import RequestClass
from voicepipe.backends.loading import TTS_SENTENCE
from voicepipe.pipeline.engine_port import Engine
from voicepipe.pipeline.events import (
    AudioOut,
    Error,
    Event,
    Feedback,
    Paced,
    PlaybackPaused,
    Played,
    ResponseCreated,
    Sentence,
    TextDone,
    TurnCancelled,
    TurnConfirmed,
    TurnDone,
)
from voicepipe.pipeline.pacing import Pacing
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Mark, Turn

log = logging.getLogger(__name__)
Synthesized = tuple[list[np.ndarray], float, Any]  # the audio's chunks, the device seconds, its words' ends
SaidPhrases = dict[str, Synthesized]  # set phrases as synthesized once, by their text


class TTSStage(Stage):
    """Synthesizes a turn's sentences in order, each due when the caller's buffered audio runs out.

    A worker task per turn does the synthesis, so a cancellation passes through this stage at once; a
    sentence of a cancelled turn whose job has not started yet is never synthesized.

    It owns the turn's pacing: it reads the caller's playback clock off the output stage's feedback as it
    passes (`Played`, `PlaybackPaused`), knows the sentences it is still to synthesize, and tells the LLM
    stage upstream when its request must deliver (`Paced`) whenever that moves. A sentence waits to be
    synthesized until the caller has less than `horizon_s()` of the reply still to hear.

    The set phrases (`phrases()`: the fillers said while a tool runs) are synthesized once and kept in
    `said`, which every call of the server shares: a filler is heard as soon as it is decided.
    """

    def __init__(self, engine: Engine, sample_rate: int, horizon_s: Callable[[], float] = lambda: 4.0,
                 phrases: Callable[[], tuple[str, ...]] = tuple, said: SaidPhrases | None = None) -> None:
        super().__init__()
        self.engine, self.sample_rate, self.pacing, self.horizon_s = engine, sample_rate, Pacing(), horizon_s
        self.phrases, self.said = phrases, {} if said is None else said
        self._turn: Turn | None = None
        self._queue: asyncio.Queue[Sentence | TextDone] = asyncio.Queue()
        self._worker: asyncio.Task | None = None
        self._confirmed = asyncio.Event()  # the current turn, begun ahead of the caller, is now the turn's

    async def process(self, event: Event) -> None:
        if isinstance(event, (Sentence, TextDone)):
            if event.turn is self._turn and (event.turn.spoken or isinstance(event, TextDone)):
                self._queue.put_nowait(event)
                if isinstance(event, Sentence):
                    self.pacing.expect(event.turn, event.index, event.text)
                    self._paced(event.turn)
            return
        if isinstance(event, ResponseCreated) or (isinstance(event, TurnCancelled) and event.turn is self._turn):
            if self._worker is not None:
                self._worker.cancel()
            self._turn, self._worker = None, None
        if isinstance(event, ResponseCreated):
            self._turn, self._queue, self._confirmed = event.turn, asyncio.Queue(), asyncio.Event()
            self._worker = self.spawn(self._speak(event.turn, self._queue))
        if isinstance(event, TurnConfirmed) and event.turn is self._turn:
            self._confirmed.set()
        if isinstance(event, ResponseCreated | TurnConfirmed):  # a new deadline to meet
            self._paced(event.turn)
        self.emit(event)

    async def feedback(self, event: Feedback) -> bool:
        """The caller's playback as the output stage reports it: read on its way to the LLM stage."""
        if isinstance(event, Played):
            self.pacing.played(event.turn, event.until)
            self._paced(event.turn)
        elif isinstance(event, PlaybackPaused) and event.at is not None:
            self.pacing.stopped(event.at)
        return False

    def _paced(self, turn: Turn) -> None:
        self.emit_upstream(Paced(turn, self.pacing.llm_deadline(turn, time.monotonic())))

    async def _speak(self, turn: Turn, queue: "asyncio.Queue[Sentence | TextDone]") -> None:
        runs_out = 0.0  # when the audio emitted so far would run out, played from its emission
        while isinstance(sentence := await queue.get(), Sentence):
            while (early := max(self.pacing.ahead(turn, now := time.monotonic()), runs_out - now)
                   - self.horizon_s()) > 0:
                await asyncio.sleep(early)  # the caller has enough to hear for now
            kept = self.said.get(sentence.text.strip())
            chunks, seconds, ends = kept if kept is not None else await self._synthesize(turn, sentence.text)
            if turn.cancelled:
                return
            turn.mark(Mark.SYNTHESIZED)
            audio_s = sum(len(c) for c in chunks) / self.sample_rate
            runs_out = max(runs_out, time.monotonic()) + audio_s
            # A kept phrase took no synthesis now: the estimates learn nothing from it.
            self.pacing.synthesized(turn, sentence.index, sentence.text, 0.0 if kept else audio_s, seconds)
            for pcm in chunks:
                self.emit(AudioOut(turn, pcm, sentence.index, sentence.text, None if ends is None else tuple(ends)))
        self.emit(TurnDone(turn, sentence.reply))

    async def _synthesize(self, turn: Turn, text: str) -> Synthesized:
        try:
            chunks, seconds, ends = await self._run_job(turn, text)
        except Exception:  # one sentence the voice cannot say must not silence the rest of the reply
            log.exception("synthesis failed for %r", text)
            self.emit(Error("tts_failed", "a sentence of the reply could not be synthesized", "server_error"))
            return [], 0.0, None
        if text.strip() in self.phrases() and chunks:
            self.said[text.strip()] = (chunks, seconds, ends)
        return chunks, seconds, ends

    async def _run_job(self, turn: Turn, text: str) -> Synthesized:
        """A speculative reply's sentence waits behind confirmed turns' realtime work; once its turn is
        confirmed, one not yet done is asked for again as the turn's, and whichever comes first is used (the
        other is dropped if it has not started)."""
        if not turn.speculative:
            return await self.engine.run_job(TTS_SENTENCE, text, cls=RequestClass.REALTIME,
                                             deadline=self.pacing.tts_deadline(turn))
        ahead = asyncio.ensure_future(self.engine.run_job(TTS_SENTENCE, text, cls=RequestClass.INTERACTIVE,
                                                          deadline=self.pacing.tts_deadline(turn)))
        confirmed = asyncio.ensure_future(self._confirmed.wait())
        racing = [ahead]
        try:
            await asyncio.wait((ahead, confirmed), return_when=asyncio.FIRST_COMPLETED)
            if not ahead.done():
                racing.append(asyncio.ensure_future(self.engine.run_job(
                    TTS_SENTENCE, text, cls=RequestClass.REALTIME, deadline=self.pacing.tts_deadline(turn))))
                await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            confirmed.cancel()
            for job in racing:
                if not job.done():
                    job.cancel()
            await asyncio.gather(*racing, return_exceptions=True)
        return next(job for job in racing if not job.cancelled()).result()
