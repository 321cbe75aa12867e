"""The first stage: endpointing, turning microphone audio into utterances, and telling when the caller
has spoken over the assistant long enough to stop it."""

import time

from voicepipe.audio import SAMPLE_RATE
from voicepipe.ids import new_id
from voicepipe.pipeline.events import (
    AudioIn,
    BargeIn,
    EndOfTurn,
    Error,
    Event,
    Feedback,
    IdleTimedOut,
    InputCleared,
    Playout,
    SpeechAudio,
    SpeechPaused,
    SpeechQuiet,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
)
from voicepipe.pipeline.requests import ClearRequested, CommitRequested, SessionUpdate
from voicepipe.pipeline.stage import Stage
from voicepipe.turns.endpointer import WINDOW_MS, Boundary, Endpointer
from voicepipe.turns.idle import IdleWatch

# Speech the caller must keep up over the assistant before its audio stops: longer than a click or most
# coughs, short enough that a real interruption silences the reply within 200 ms of its onset.
BARGE_IN_MS = 4 * WINDOW_MS


class VADStage(Stage):
    """Runs the VAD inline on each piece of audio (it costs well under a millisecond per window).

    Under semantic turn detection the end of an utterance may come from the LLM, as `EndOfTurn` feedback
    at a pause: the utterance ends then, unless the caller has spoken again since.

    The end of speech is the caller's: when their last voiced window came in (audio arrives in real time,
    so a window's time is its feed's time less the samples fed after it), not when the silence that
    confirms it ran out. Under manual turns the client's commit is the end.

    It also keeps the idle countdown (`IdleWatch`) on the same audio: from the end of the caller's speech,
    moved on to the end of each reply chunk's playback as it goes out (`Playout`, on its way to the front end).
    """

    def __init__(self, endpointer: Endpointer) -> None:
        super().__init__()
        self.endpointer = endpointer
        self.item_id = ""
        self._paused_at: float | None = None  # silence began after speech, and the utterance is not over yet
        self._quiet = False  # the caller fell silent (the engine was told to expect them) and has not spoken since
        self._speech_ms = 0  # speech heard in the utterance so far
        self._voiced_at = 0.0  # when the utterance's last voiced window came in
        self._fed_at = 0.0  # when the previous audio came in
        self.idle = IdleWatch()

    async def process(self, event: Event) -> None:
        if isinstance(event, AudioIn):
            self._boundaries(self.endpointer.feed(event.samples, event.unsuppressed))
            self._fed_at = time.monotonic()
            self._idle()
        elif isinstance(event, CommitRequested):
            found = self.endpointer.commit()
            if not found:
                self.emit(Error("input_audio_buffer_commit_empty", "there is no speech in the input audio buffer "
                                "to commit", event_id=event.event_id))
            self._boundaries(found)
        elif isinstance(event, SessionUpdate):
            for name, value in event.turn_detection.items():  # the endpointer reads its settings live
                setattr(self.endpointer.settings, name, value)
            self.emit(event)
        elif isinstance(event, ClearRequested):
            self._paused_at, self._quiet = None, False
            self.emit(InputCleared(self.item_id if self.endpointer.clear() else None))
        else:
            self.emit(event)

    async def feedback(self, event: Feedback) -> bool:
        if isinstance(event, Playout):  # audio the caller hears until its end: the silence counts from there
            ahead_s = event.start + len(event.samples) / event.sample_rate - time.monotonic()
            self.idle.quiet_from(self._fed_ms() + max(0, int(ahead_s * 1000)))
            return False
        if not isinstance(event, EndOfTurn):
            return False
        if event.item_id == self.item_id and event.paused_at == self._paused_at:
            self._boundaries(self.endpointer.end_after(event.silence_ms))
        return True

    def _fed_ms(self) -> int:
        return self.endpointer.fed * 1000 // SAMPLE_RATE

    def _idle(self) -> None:
        settings = self.endpointer.settings
        span = self.idle.tick(self._fed_ms(), None if settings.manual else settings.idle_timeout_ms)
        if span is not None:
            self.emit(IdleTimedOut(new_id("item"), span.start_ms, span.end_ms, span.unanswered, time.monotonic()))

    def _arrived(self, position: int, now: float) -> float:
        """When the audio up to stream `position` came in: real time back from the newest sample, and no
        earlier than the feed before this one (audio sent faster than real time)."""
        return min(now, max(self._fed_at, now - (self.endpointer.fed - position) / SAMPLE_RATE))

    def _boundaries(self, boundaries: list[Boundary]) -> None:
        now = time.monotonic()
        for found in boundaries:
            ms = found.position * 1000 // SAMPLE_RATE
            if found.kind == "start":
                self.item_id, self._speech_ms = new_id("item"), 0
                self.idle.speech()
                self.emit(SpeechStarted(self.item_id, ms, now, heard=not self.endpointer.settings.manual))
            elif found.kind == "audio":
                self.emit(SpeechAudio(self.item_id, found.audio, found.is_speech))
                if found.is_speech:
                    self._voiced_at = self._arrived(found.position, now)
                    self._heard_speech()
                if found.is_speech and (self._paused_at is not None or self._quiet):
                    self._paused_at, self._quiet = None, False
                    self.emit(SpeechResumed(self.item_id))
            elif found.kind == "quiet":
                self._quiet = True
                self.emit(SpeechQuiet(self.item_id, self._voiced_at))
            elif found.kind == "pause":
                self._paused_at = now
                self.emit(SpeechPaused(self.item_id, found.speech_samples, now, self._voiced_at, self._speech_ms))
            else:
                self._paused_at, self._quiet = None, False
                end = now if self.endpointer.settings.manual else self._voiced_at
                self.emit(SpeechStopped(self.item_id, ms, now, found.speech_samples, found.truncated, end,
                                        self._speech_ms))
                self.idle.quiet_from(ms)
                if found.truncated:
                    limit = self.endpointer.max_utterance_s
                    self.emit(Error("utterance_too_long", f"speech longer than {limit:g} s was cut there and "
                                    "transcribed; the rest is ignored until the next pause"))

    def _heard_speech(self) -> None:
        """One more window of speech (the prefix padding counts as one): at BARGE_IN_MS, a barge-in."""
        settings = self.endpointer.settings
        self._speech_ms += WINDOW_MS
        if self._speech_ms == BARGE_IN_MS and not settings.manual and settings.interrupt_response:
            self.emit(BargeIn(self.item_id))
