"""The first stage: endpointing, turning microphone audio into utterances."""

import time

from voicepipe.pipeline.events import (
    AudioIn,
    ClearRequested,
    CommitRequested,
    Error,
    Event,
    InputCleared,
    SpeechAudio,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    new_id,
)
from voicepipe.pipeline.stage import Stage
from voicepipe.vad import SAMPLE_RATE, Boundary, Endpointer


class VADStage(Stage):
    """Runs the VAD inline on each piece of audio (it costs well under a millisecond per window)."""

    def __init__(self, endpointer: Endpointer) -> None:
        super().__init__()
        self.endpointer = endpointer
        self.item_id = ""
        self._paused = False  # silence began after speech, and the utterance is not over yet

    async def process(self, event: Event) -> None:
        if isinstance(event, AudioIn):
            self._boundaries(self.endpointer.feed(event.samples))
        elif isinstance(event, CommitRequested):
            found = self.endpointer.commit()
            if not found:
                self.emit(Error("input_audio_buffer_commit_empty", "there is no speech in the input audio buffer "
                                "to commit"))
            self._boundaries(found)
        elif isinstance(event, ClearRequested):
            self._paused = False
            self.emit(InputCleared(self.item_id if self.endpointer.clear() else None))
        else:
            self.emit(event)

    def _boundaries(self, boundaries: list[Boundary]) -> None:
        now = time.monotonic()
        for found in boundaries:
            ms = found.position * 1000 // SAMPLE_RATE
            if found.kind == "start":
                self.item_id = new_id("item")
                self.emit(SpeechStarted(self.item_id, ms, now))
            elif found.kind == "audio":
                self.emit(SpeechAudio(self.item_id, found.audio, found.is_speech))
                if found.is_speech and self._paused:
                    self._paused = False
                    self.emit(SpeechResumed(self.item_id))
            elif found.kind == "pause":
                self._paused = True
                self.emit(SpeechPaused(self.item_id, found.speech_samples, now))
            else:
                self._paused = False
                self.emit(SpeechStopped(self.item_id, ms, now, found.speech_samples, found.truncated))
                if found.truncated:
                    limit = self.endpointer.max_utterance_s
                    self.emit(Error("utterance_too_long", f"speech longer than {limit:g} s was cut there and "
                                    "transcribed; the rest is ignored until the next pause"))
