"""The first stage of a call: the microphone's audio with the reply's echo cancelled and the noise
suppressed, before the VAD and the ASR hear it.

It runs inline on the call's task, as the VAD does: a 10 ms frame costs about 0.1 ms, less than a round
trip to the engine would, and the VAD waits for it either way. The far end comes up from the output
stage as feedback (`Playout`, `PlayoutCut`), so the stage list stays the whole truth of who tells whom.
"""

import time
from collections.abc import Callable

import numpy as np

from voicepipe.frontend.processing import AudioProcessing
from voicepipe.frontend.recording import FrontEndRecording
from voicepipe.frontend.reference import FarEnd, NearEnd
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.events import AudioIn, EchoPathJudged, Event, Feedback, Playout, PlayoutCut
from voicepipe.pipeline.requests import SessionUpdate
from voicepipe.pipeline.stage import Stage


class EchoReport:
    """How much echo the canceller removed while the reply played: echo return loss enhancement, the
    microphone's energy over the cleaned audio's, in dB, over the frames where the caller was silent
    (the VAD's verdict arrives later, so the quieter half of the frames stands for them)."""

    def __init__(self) -> None:
        self._ratios: list[float] = []

    def add(self, near: np.ndarray, out: np.ndarray) -> None:
        if len(out) and len(near) >= len(out):
            before = float(np.mean(np.square(near[: len(out)], dtype=np.float64)))
            after = float(np.mean(np.square(out, dtype=np.float64)))
            if before > 1e-8:
                self._ratios.append(min(60.0, 10 * np.log10(before / max(after, 1e-12))))  # a gated frame: 60
                del self._ratios[:-500]

    def erle_db(self) -> float | None:
        if not self._ratios:
            return None
        ratios = sorted(self._ratios)
        return float(np.mean(ratios[len(ratios) // 2:]))


class AudioFrontEnd:
    """Per call: the far end on the server's clock, the near end's clock, and the processing module.
    With `own_far_end` its line says what the loudspeaker played and when (`talk`), and the output stage's
    playback clock, a guess beside that, is not used."""

    def __init__(self, config: CallConfig, clock: Callable[[], float] = time.monotonic,
                 own_far_end: bool = False) -> None:
        self.config, self.clock, self.own_far_end = config, clock, own_far_end
        self.far, self.near = FarEnd(), NearEnd()
        self.processing = AudioProcessing(config.echo_cancellation, config.noise_reduction)
        self.echo = EchoReport()
        self.recording: FrontEndRecording | None = None  # what the processing is given, kept for a replay

    def clean(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The cleaned audio for `samples`, and where the suppressor ran, the same audio before it."""
        start = self.near.feed(len(samples), self.clock())
        # Audio sent faster than real time was recorded before it came (a file, a test): no loudspeaker played
        # into it that the server's clock could place, so there is nothing to cancel.
        live = self.processing.echo and self.near.live
        far = self.far.read(start, len(samples)) if live else np.zeros(len(samples), np.float32)
        # (a sound card's far end is what it played, one stream on its own clock: it never starts anew)
        restart = self.far.started(start, len(samples)) if live and not self.own_far_end else None
        if self.recording is not None:
            self.recording.add(samples, far, restart, self.processing.echo, self.processing.noise)
        if not self.processing.active:
            return samples, None
        out = self.processing.process(samples, far, restart)
        unsuppressed = self.processing.unsuppressed
        if self.processing.echo and np.any(far):  # the canceller's own figure, whatever the suppressor took
            self.echo.add(samples, out if unsuppressed is None else unsuppressed)
        return out, unsuppressed

    @property
    def loudspeaker_heard(self) -> bool | None:
        """Whether the microphone hears the loudspeaker: judged while cancelling (None until the far end has
        played long enough), assumed when not."""
        return True if not self.processing.echo else self.processing.path.verdict

    def recorded(self, position: int, n: int, at: float) -> None:
        """The microphone's `n` samples from `position` (16 kHz, from the call's start) had been recorded by
        `at`."""
        self.near.recorded_by(position, n, at)

    def played(self, samples: np.ndarray, sample_rate: int, start: float) -> None:
        """Reply audio (PCM16 or float32) due to play from `start`."""
        audio = samples.astype(np.float32) / 32768.0 if samples.dtype == np.int16 else samples
        self.far.play(start, audio, self.clock(), sample_rate)

    def configure(self) -> None:
        self.processing.configure(self.config.echo_cancellation, self.config.noise_reduction)


class FrontEndStage(Stage):
    """The first stage: microphone audio in, cleaned audio out; the far end taken from the feedback."""

    def __init__(self, front: AudioFrontEnd) -> None:
        super().__init__()
        self.front = front
        self._heard: bool | None = None

    async def process(self, event: Event) -> None:
        if isinstance(event, AudioIn):
            out, unsuppressed = self.front.clean(event.samples)
            heard = self.front.loudspeaker_heard
            if heard is not None and heard != self._heard:
                self._heard = heard
                self.emit(EchoPathJudged(heard))
            if len(out):
                self.emit(AudioIn(out, unsuppressed))
            return
        if isinstance(event, SessionUpdate) and event.audio_input:
            for name, value in event.audio_input.items():
                setattr(self.front.config, name, value)
            self.front.configure()
        self.emit(event)

    async def feedback(self, event: Feedback) -> bool:
        if isinstance(event, Playout):
            if not self.front.own_far_end:
                self.front.played(event.samples, event.sample_rate, event.start)
            return True
        if isinstance(event, PlayoutCut):
            if not self.front.own_far_end:
                self.front.far.cut(event.at)
            return True
        return False
