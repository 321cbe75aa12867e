"""Voice activity detection and endpointing: where an utterance starts and where it ends.

Silero VAD scores each 32 ms window of 16 kHz audio; the ONNX model is the one faster-whisper ships, so
nothing is downloaded. It runs inline on the call's own asyncio task, not as an engine job: a window costs
well under a millisecond on one thread, so queueing it behind model steps would only add latency to
barge-in and endpointing, where every window counts.

Endpointing follows the OpenAI Realtime API's server VAD defaults: threshold 0.5, 300 ms of prefix padding
kept before the detected start, and (server_vad) 500 ms of silence to end an utterance. Under semantic_vad
the silence that ends it is the eagerness' longest, and the call's pipeline ends it sooner (`commit`) when
the LLM judges the message finished; under manual turns only `commit` ends it.
"""

import functools
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from voicepipe.audio import SAMPLE_RATE
from voicepipe.backends.threads import onnx_options
from voicepipe.pipeline.detection import TurnDetection

WINDOW = 512  # samples per Silero window at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees before each window
WINDOW_MS = 1000 * WINDOW // SAMPLE_RATE
HYSTERESIS = 0.15  # once speaking, speech continues down to threshold - HYSTERESIS (as Silero does)
# The threshold follows the noise floor: the VAD's mean score over the silence between utterances (FLOOR_S
# of it, weighted to the recent), plus FLOOR_MARGIN, when that is above the set threshold. A steady noise
# that scores 0.3 then neither starts an utterance nor holds one open; speech scores 0.9 and more.
FLOOR_S = 3.0
FLOOR_MARGIN = 0.35
MAX_THRESHOLD = 0.85
# The level follows it too: other voices around the caller (a café, a television) score as speech, but the
# caller, nearer the microphone, stands above them. A window is speech only LEVEL_MARGIN_DB over the level
# floor (LEVEL_HYSTERESIS_DB less once speaking): the LEVEL_PERCENTILE-th percentile of every window's level
# over the last LEVEL_S, once LEVEL_FIRST windows have come (before, -100 dBFS: anything loud enough for
# the VAD). A caller's own pauses keep it down in a quiet room; steady noise or babble sets it a few dB
# under their mean.
LEVEL_MARGIN_DB = 10.0
LEVEL_HYSTERESIS_DB = 2.0
LEVEL_PERCENTILE = 10
LEVEL_S = 5.0
LEVEL_FIRST = 16  # half a second


def silero_model_path() -> Path:
    """The Silero VAD ONNX file inside the installed faster-whisper."""
    import faster_whisper

    found = sorted((Path(faster_whisper.__file__).parent / "assets").glob("silero_vad*.onnx"))
    if not found:
        raise FileNotFoundError("faster-whisper ships no silero_vad*.onnx in its assets")
    return found[-1]


@functools.cache
def _session(path: Path):
    """One ONNX session for every call: the model's recurrent state lives with each caller, not in it."""
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), sess_options=onnx_options(threads=1),
                                        providers=["CPUExecutionProvider"])


class SileroVAD:
    """Speech probability per window, keeping the recurrent state and audio context of one stream."""

    def __init__(self, model_path: Path | None = None) -> None:
        self.session = _session(model_path or silero_model_path())
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros((1, 1, 128), np.float32)
        self._c = np.zeros((1, 1, 128), np.float32)
        self._context = np.zeros(CONTEXT, np.float32)

    def __call__(self, window: np.ndarray) -> float:
        """The probability that a window of WINDOW float32 samples holds speech."""
        x = np.concatenate([self._context, window]).astype(np.float32, copy=False)[None, :]
        prob, self._h, self._c = self.session.run(None, {"input": x, "h": self._h, "c": self._c})
        self._context = window[-CONTEXT:]
        return float(prob[0])


@dataclass(frozen=True, slots=True)
class Boundary:
    """What the endpointer found in the audio fed to it.

    start: speech began (`position` is where the utterance audio begins, prefix padding included).
    audio: more utterance audio (`audio`), `is_speech` telling whether the VAD heard speech in it.
    quiet: the first silence after speech (`quiet_ms` of it): the turn may be ending, so the device had
      better keep its steps short from now on.
    pause: silence began after speech; `speech_samples` of the utterance hold all its speech so far.
    stop: the utterance ended at stream `position`; `truncated` when it was cut at the length limit.
    """

    kind: Literal["start", "audio", "quiet", "pause", "stop"]
    position: int  # samples since the stream began
    audio: np.ndarray | None = None
    is_speech: bool = False
    speech_samples: int = 0
    truncated: bool = False


class Endpointer:
    """Turns a stream of 16 kHz audio into utterances: start, their audio, an early pause, and the stop.

    `early_pause_ms` of silence announces a pause before the end is confirmed, so the final transcription
    (and under semantic_vad the end-of-turn decision) can begin while the endpointer still waits for the
    settings' longest silence; `quiet_ms` of silence says sooner that it may be coming. An utterance
    reaching `max_utterance_s` is cut there; the rest of that
    speech is ignored until the caller next falls silent. Under manual turns every sample belongs to the
    utterance in progress, from the first one after the last commit, and no silence ends it.
    """

    def __init__(self, settings: TurnDetection | None = None, vad: SileroVAD | None = None,
                 max_utterance_s: float = 30.0, early_pause_ms: int = 200, quiet_ms: int = 96) -> None:
        self.settings = settings or TurnDetection()
        self.vad = vad or SileroVAD()
        self.max_utterance_s = max_utterance_s
        self.max_windows = max(1, int(max_utterance_s * SAMPLE_RATE) // WINDOW)
        self.early_pause_ms, self.quiet_ms = early_pause_ms, quiet_ms
        self._pending = np.zeros(0, np.float32)
        self._pending_judged = np.zeros(0, np.float32)  # the same samples before noise suppression
        self._position = 0  # samples fed to the VAD so far
        self._prefix: deque[np.ndarray] = deque()
        self._state: Literal["idle", "speech", "cut"] = "idle"
        self._windows = 0  # windows in the current utterance
        self._silent = 0  # consecutive silent windows
        self._paused = False
        self._quiet = False  # the quiet boundary of this silence was reported
        self._limit_ms: int | None = None  # a silence limit for this pause, from `end_after`
        self.noise_floor = 0.0  # the VAD's mean score between utterances
        self._levels: deque[float] = deque(maxlen=int(LEVEL_S * 1000 / WINDOW_MS))  # window levels, dBFS
        self.level_floor = -100.0

    @property
    def fed(self) -> int:
        """Samples fed so far, the ones not yet in a whole window included."""
        return self._position + len(self._pending)

    def feed(self, samples: np.ndarray, unsuppressed: np.ndarray | None = None) -> list[Boundary]:
        """Add audio; return what it revealed, in order. `unsuppressed` is the same audio before noise
        suppression, where that ran: the VAD and the level rule judge it, and the utterance is `samples`.
        A suppressor helps the ASR, but takes the troughs of other voices down and not their peaks, which
        then stood 10 dB over the level floor (in babble, half the utterances never ended), and the VAD
        scored what was left of them as a voice the more (three times the false barge-ins)."""
        audio = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        judged = audio if unsuppressed is None else np.concatenate([self._pending_judged, unsuppressed])
        whole = len(audio) // WINDOW * WINDOW
        self._pending, self._pending_judged = audio[whole:], judged[whole:]
        found: list[Boundary] = []
        for start in range(0, whole, WINDOW):
            found += self._window(audio[start:start + WINDOW], judged[start:start + WINDOW])
        return found

    def end_after(self, silence_ms: int) -> list[Boundary]:
        """End the utterance in progress once its silence lasts `silence_ms` (now, if it already has); the
        limit holds until speech resumes."""
        if self._state != "speech":
            return []
        if self._silent * WINDOW_MS >= silence_ms:
            return self.commit()
        self._limit_ms = silence_ms
        return []

    def commit(self) -> list[Boundary]:
        """End the utterance in progress now, as if its silence had run out; [] when there is none."""
        if self._state != "speech":
            return []
        self._state = "idle"
        return [Boundary("stop", self._position, speech_samples=(self._windows - self._silent) * WINDOW)]

    def clear(self) -> bool:
        """Drop the utterance in progress and the audio not yet endpointed; True if speech was dropped."""
        dropped = self._state == "speech"
        self._state, self._silent, self._paused = "idle", 0, False
        self._pending = self._pending_judged = np.zeros(0, np.float32)
        self._prefix.clear()
        return dropped

    @property
    def threshold(self) -> float:
        """The threshold in force: the setting's, or above the noise floor where that is higher."""
        return max(self.settings.threshold, min(MAX_THRESHOLD, self.noise_floor + FLOOR_MARGIN))

    def _window(self, window: np.ndarray, judged: np.ndarray) -> list[Boundary]:
        """`window` of the utterance's audio, judged by `judged` (the same before noise suppression)."""
        prob = self.vad(judged)
        self._position += WINDOW
        s = self.settings
        threshold = self.threshold
        level = 10 * float(np.log10(np.mean(np.square(judged, dtype=np.float64)) + 1e-10))
        self._levels.append(level)
        if len(self._levels) >= LEVEL_FIRST and self._position % (8 * WINDOW) == 0:  # every quarter second
            self.level_floor = float(np.percentile(self._levels, LEVEL_PERCENTILE))
        above = level - self.level_floor
        if self._state == "idle":
            if (prob >= threshold and above >= LEVEL_MARGIN_DB) or s.manual:
                return self._start(window)
            self.noise_floor += (prob - self.noise_floor) * WINDOW_MS / (FLOOR_S * 1000)
            self._prefix.append(window)
            while len(self._prefix) * WINDOW_MS > s.prefix_padding_ms:
                self._prefix.popleft()
            return []
        speech = prob >= max(0.01, threshold - HYSTERESIS) and above >= LEVEL_MARGIN_DB - LEVEL_HYSTERESIS_DB
        self._silent = 0 if speech else self._silent + 1
        if self._state == "cut":
            if self._silent * WINDOW_MS >= s.max_silence_ms or s.manual:
                self._state = "idle"
            return []
        self._windows += 1
        found = [Boundary("audio", self._position, window, is_speech=speech)]
        speech_samples = (self._windows - self._silent) * WINDOW
        silence_ms = self._silent * WINDOW_MS
        if s.manual:
            pass
        elif speech:
            self._paused, self._quiet, self._limit_ms = False, False, None
        else:
            if not self._quiet and silence_ms >= self.quiet_ms:
                self._quiet = True
                found.append(Boundary("quiet", self._position, speech_samples=speech_samples))
            if not self._paused and silence_ms >= self.early_pause_ms:
                self._paused = True
                found.append(Boundary("pause", self._position, speech_samples=speech_samples))
        limit = s.max_silence_ms if self._limit_ms is None else min(self._limit_ms, s.max_silence_ms)
        if not s.manual and silence_ms >= limit:
            self._state = "idle"
            found.append(Boundary("stop", self._position, speech_samples=speech_samples))
        elif self._windows >= self.max_windows:
            self._state, self._silent = "cut", 0
            found.append(Boundary("stop", self._position, speech_samples=speech_samples, truncated=True))
        return found

    def _start(self, window: np.ndarray) -> list[Boundary]:
        head = np.concatenate([*self._prefix, window])
        self._prefix.clear()
        self._state, self._windows, self._silent, self._paused = "speech", len(head) // WINDOW, 0, False
        self._quiet = False
        self._limit_ms = None
        return [Boundary("start", self._position - len(head)),
                Boundary("audio", self._position, head, is_speech=True)]
