"""The turn-taking evaluation set, generated here: each question spoken whole, cut at a word boundary,
and with a pause of 0.7-1.0 s inside, by three espeak-ng voices and the Piper voice.

espeak-ng speaks the paused form from SSML (`<break>`), so the words before the pause keep the melody of a
sentence going on; the cut form is that audio up to the pause. Piper has no such break, so its paused form
joins the two halves said apart (the first half then ends as a sentence would: a harder case).
"""

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicepipe.audio import read_audio, resample, to_float32

RATE = 16000
# (the words before the pause, the rest): the first half alone is a sentence cut at a word boundary.
SPLIT_QUESTIONS = [
    ("What is the capital of", "France?"), ("How many days are there", "in a year?"),
    ("Can you tell me", "a joke about cats?"), ("What do bees", "make?"),
    ("Which planet is", "closest to the sun?"), ("How many legs does", "a spider have?"),
    ("What colour is", "the sky on a clear day?"), ("Who wrote", "the play Romeo and Juliet?"),
    ("What is the opposite of", "hot?"), ("Name a fruit that is", "yellow."),
    ("How do I make", "a cup of tea?"), ("What is two plus", "three?"),
]
ESPEAK_VOICES = ("en-us", "en-gb", "en+f3")
KINDS = ("complete", "cut", "paused")


@dataclass(frozen=True)
class Sample:
    kind: str  # complete | cut | paused
    voice: str
    first: str
    rest: str
    audio: np.ndarray  # 16 kHz float32, speech only (no silence before or after)
    pause_s: float = 0.0  # the pause inside a paused sample (after a cut one, in its paused form)

    @property
    def text(self) -> str:
        return self.first if self.kind == "cut" else f"{self.first} {self.rest}"


def trim(audio: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    """The audio from its first to its last sample louder than `threshold`."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    return audio[loud[0]:loud[-1] + 1] if loud.size else audio[:0]


def espeak_audio(voice: str, text: str, ssml: bool = False) -> np.ndarray:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "speech.wav"
        subprocess.run(["espeak-ng", *(["-m"] if ssml else []), "-v", voice, "-w", str(path), text],
                       check=True, capture_output=True)
        return trim(read_audio(path, RATE))


def _longest_gap(audio: np.ndarray, threshold: float = 0.01) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(audio) > threshold)
    gap = int(np.argmax(np.diff(loud)))
    return int(loud[gap]) + 1, int(loud[gap + 1])


def espeak_samples(voice: str, first: str, rest: str, pause_s: float) -> list[Sample]:
    paused = espeak_audio(voice, f'<speak>{first} <break time="{int(pause_s * 1000)}ms"/> {rest}</speak>', ssml=True)
    end, _ = _longest_gap(paused)
    return [Sample("complete", voice, first, rest, espeak_audio(voice, f"{first} {rest}")),
            Sample("cut", voice, first, rest, paused[:end], pause_s),
            Sample("paused", voice, first, rest, paused, pause_s)]


def say_with(tts, text: str) -> np.ndarray:
    """`text` in the TTS voice, at 16 kHz, silence trimmed."""
    pcm = np.concatenate(list(tts.synthesize(text)))
    return trim(resample(to_float32(pcm), tts.sample_rate, RATE))


def piper_samples(tts, first: str, rest: str, pause_s: float) -> list[Sample]:
    head = say_with(tts, first)
    paused = np.concatenate([head, np.zeros(int(pause_s * RATE), np.float32), say_with(tts, rest)])
    return [Sample("complete", "piper", first, rest, say_with(tts, f"{first} {rest}")),
            Sample("cut", "piper", first, rest, head, pause_s),
            Sample("paused", "piper", first, rest, paused, pause_s)]


def turn_set(tts=None, voices: tuple[str, ...] = (*ESPEAK_VOICES, "piper"), questions: int | None = None
             ) -> list[Sample]:
    """Every question (the first `questions`) in every voice, in its three forms."""
    chosen = SPLIT_QUESTIONS[:questions]
    samples = []
    for n, (first, rest) in enumerate(chosen):
        pause_s = 0.7 + 0.3 * n / max(1, len(chosen) - 1)
        for voice in voices:
            if voice == "piper":
                samples += piper_samples(tts, first, rest, pause_s)
            else:
                samples += espeak_samples(voice, first, rest, pause_s)
    return samples
