"""Streaming speech recognition: partial transcripts while the caller speaks, the final one when they stop."""

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from scheduler import RequestClass
from voicepipe.audio import SAMPLE_RATE, resample
from voicepipe.backends.loading import ASR_FINAL, ASR_PARTIAL
from voicepipe.pipeline.agreement import Agreement
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.engine_port import Engine
from voicepipe.pipeline.events import (
    Error,
    Event,
    InputCleared,
    SpeechAudio,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    TranscriptDelta,
    TranscriptEarly,
    TranscriptFinal,
)
from voicepipe.pipeline.stage import Stage

MIN_PARTIAL_S = 0.5  # shorter audio gives Whisper too little to say anything stable
# Partial passes take at most one part in PARTIAL_SHARE of the time: a pass still running when the caller
# stops delays the final one, so on a slow device they are spaced out rather than run back to back.
PARTIAL_SHARE = 3
ASR_JOBS = (ASR_PARTIAL, ASR_FINAL)  # job kinds whose durations measure an ASR pass
# Final passes one call may have waiting: a client sending utterances faster than they can be transcribed
# (audio faster than real time) has the surplus dropped with an error, instead of queueing device work.
MAX_PENDING_FINALS = 3


@dataclass(eq=False)
class _Utterance:
    item_id: str
    last_pass: float  # when the last partial pass started (the utterance's start at first)
    chunks: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    agreement: Agreement = field(default_factory=Agreement)
    partial_text: str = ""
    partial_task: asyncio.Task | None = None
    early: tuple[int, asyncio.Task] | None = None  # (speech samples it covers, final pass started early)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    def cancel(self) -> None:
        """Stop its partial pass (skipped if it has not started): the utterance is over."""
        if self.partial_task is not None:
            self.partial_task.cancel()


class ASRStage(Stage):
    """Partial transcripts while the caller speaks, and the final one when they stop.

    Partial passes are optional work: INTERACTIVE jobs, one at a time, at most every
    `partial_interval_s` (or every PARTIAL_SHARE passes' time, when a pass is slow), skipped while the
    engine has other jobs or realtime requests. Words two passes
    agree on are committed. The final pass is a REALTIME job started at the first pause, before the end
    of speech is confirmed, and used if the caller said nothing more; otherwise it is run again on the
    whole utterance. Final passes go through `finals`, shared by the server's calls, so the passes of
    callers who stop together run as one job.
    """

    def __init__(self, engine: Engine, asr_rate: int, config: CallConfig) -> None:
        super().__init__()
        self.engine, self.asr_rate, self.config = engine, asr_rate, config
        self.utterance: _Utterance | None = None
        self._last_final: asyncio.Task | None = None
        self._pending_finals = 0

    async def process(self, event: Event) -> None:
        utt = self.utterance
        if isinstance(event, SpeechStarted):
            self.utterance = _Utterance(event.item_id, event.at)
            self.emit(event)
        elif isinstance(event, SpeechAudio):
            if utt is not None and utt.item_id == event.item_id:
                utt.chunks.append(event.samples)
                utt.samples += len(event.samples)
                if event.is_speech:
                    if utt.early is not None:  # speech resumed: the early final pass missed some of it
                        utt.early[1].cancel()
                        utt.early = None
                    self._maybe_partial(utt)
        elif isinstance(event, SpeechPaused):
            if utt is not None and utt.item_id == event.item_id:
                self._start_early_final(utt, event)
        elif isinstance(event, SpeechStopped):
            self.emit(event)
            if utt is not None and utt.item_id == event.item_id:
                self.utterance = None
                utt.cancel()
                if self._pending_finals >= MAX_PENDING_FINALS:
                    self.emit(Error("too_much_audio", f"{MAX_PENDING_FINALS} utterances are still being "
                                    "transcribed; this one was dropped (is the audio sent faster than real time?)"))
                    return
                self._pending_finals += 1
                self._last_final = self.spawn(self._final(utt, event, self._last_final))
        elif isinstance(event, InputCleared):
            if utt is not None and utt.item_id == event.item_id:
                self.utterance = None
                utt.cancel()
                if utt.early is not None:
                    utt.early[1].cancel()
            self.emit(event)
        else:
            self.emit(event)

    # -- partial passes --------------------------------------------------------------------------------------
    def _maybe_partial(self, utt: _Utterance) -> None:
        now = time.monotonic()
        if (utt.partial_task is not None or utt.samples < MIN_PARTIAL_S * SAMPLE_RATE
                or now - utt.last_pass < self.config.partial_interval_s or self.engine.busy()
                or now - utt.last_pass < PARTIAL_SHARE * self.engine.mean_job_seconds(ASR_JOBS)):
            return
        utt.last_pass = now
        utt.partial_task = self.spawn(self._partial(utt))

    async def _partial(self, utt: _Utterance) -> None:
        try:
            text = await self._partial_pass(utt.audio())
        finally:
            utt.partial_task = None
        if self.utterance is not utt:
            return  # the utterance ended meanwhile: its final transcript is on the way
        delta, whole = utt.agreement.update(text)
        if whole != utt.partial_text:
            utt.partial_text = whole
            self.emit(TranscriptDelta(utt.item_id, delta, whole))

    # -- the final pass --------------------------------------------------------------------------------------
    def _start_early_final(self, utt: _Utterance, paused: SpeechPaused) -> None:
        if utt.early is not None:
            utt.early[1].cancel()
        if utt.partial_task is not None:
            utt.partial_task.cancel()
        due = paused.at + self.config.turn_detection.end_after_pause_s(self.config.early_final_ms)
        task = self.spawn(self._early_final(utt, paused, due))
        utt.early = (paused.speech_samples, task)

    async def _early_final(self, utt: _Utterance, paused: SpeechPaused, due: float) -> str:
        """The final pass at the pause; its transcript goes out at once, so a reply can start on it."""
        text = await self._final_pass(utt.audio(), due)
        self.emit(TranscriptEarly(utt.item_id, text, paused.at, paused.speech_end))
        return text

    async def _final(self, utt: _Utterance, stopped: SpeechStopped, previous: asyncio.Task | None) -> None:
        try:
            await self._transcribe_final(utt, stopped, previous)
        finally:
            self._pending_finals -= 1

    async def _transcribe_final(self, utt: _Utterance, stopped: SpeechStopped, previous: asyncio.Task | None
                                ) -> None:
        text = None
        if utt.early is not None:
            covered, task = utt.early
            if stopped.speech_samples <= covered:
                await asyncio.wait({task})
                if not task.cancelled() and task.exception() is None:
                    text = task.result()
            else:
                task.cancel()
        if text is None:
            text = await self._final_pass(utt.audio(), stopped.at)
        if previous is not None:
            await asyncio.wait({previous})  # transcripts go out in the order the utterances ended
        end = stopped.voiced_end
        self.emit(TranscriptFinal(utt.item_id, text, end, time.monotonic() - end, utt.samples / SAMPLE_RATE,
                                  stopped.at))

    async def _final_pass(self, audio: np.ndarray, deadline: float) -> str:
        audio = resample(audio, SAMPLE_RATE, self.asr_rate)
        return await self.engine.run_job(ASR_FINAL, audio, cls=RequestClass.REALTIME, deadline=deadline)

    async def _partial_pass(self, audio: np.ndarray) -> str:
        audio = resample(audio, SAMPLE_RATE, self.asr_rate)
        return await self.engine.run_job(ASR_PARTIAL, audio, cls=RequestClass.INTERACTIVE)
