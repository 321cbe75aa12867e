"""Synthetic rooms: what a speakerphone's microphone picks up besides the caller.

A room is the path from the loudspeaker to the microphone (a delay, then an exponentially decaying tail of
reflections with the room's RT60) and the noise around the caller. The echo's level is set against the
caller's voice, as a person hears it: "6 dB above" is a laptop speaker turned up beside a quiet talker.
Everything is seeded, so a room is the same room in every run.
"""

from dataclasses import dataclass

import numpy as np

RATE = 16000
NOISE_KINDS = ("pink", "babble", "music")
DRR_DB = 3.0  # direct-to-reverberant ratio


@dataclass(frozen=True, slots=True)
class Room:
    """The loudspeaker-to-microphone path: `delay_ms` before the direct sound, reflections dying away by
    60 dB over `rt60_s`, the echo `echo_db` above (or, negative, below) the caller's voice."""

    delay_ms: float = 120.0
    rt60_s: float = 0.45
    echo_db: float = 0.0
    seed: int = 0

    def impulse_response(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        delay = int(self.delay_ms * RATE / 1000)
        tail = max(1, int(self.rt60_s * RATE))
        t = np.arange(tail) / RATE
        reflections = rng.standard_normal(tail) * np.exp(-6.91 * t / max(self.rt60_s, 1e-3))  # -60 dB at RT60
        reflections[: int(0.003 * RATE)] = 0.0  # the first reflection comes a few ms after the direct sound
        # The reverberant energy DRR_DB under the direct sound's: a speakerphone's microphone sits near its speaker.
        reflections *= np.sqrt(10 ** (-DRR_DB / 10) / max(float(np.sum(reflections ** 2)), 1e-12))
        response = np.zeros(delay + tail, np.float32)
        response[delay] = 1.0
        response[delay:] += reflections.astype(np.float32)
        return response

    def echo(self, played: np.ndarray, voice_rms: float) -> np.ndarray:
        """What the microphone hears of `played` (16 kHz, as the loudspeaker played it), scaled so its
        level while the reply sounds is `echo_db` from `voice_rms`; as long as `played`."""
        response = self.impulse_response()
        size = len(played) + len(response)
        heard = np.fft.irfft(np.fft.rfft(played, size) * np.fft.rfft(response, size), size)[: len(played)]
        heard = heard.astype(np.float32)
        level = active_rms(heard)
        if level == 0.0:
            return heard
        return heard * np.float32(voice_rms * 10 ** (self.echo_db / 20) / level)


def active_rms(audio: np.ndarray, frame: int = 320) -> float:
    """The RMS of the frames that carry sound (within 30 dB of the loudest): a voice's level, not its pauses'."""
    n = len(audio) // frame
    if n == 0:
        return float(np.sqrt(np.mean(np.square(audio)))) if len(audio) else 0.0
    energy = np.mean(np.square(audio[: n * frame].reshape(n, frame).astype(np.float64)), axis=1)
    loud = energy[energy >= energy.max() * 1e-3]
    return float(np.sqrt(loud.mean())) if loud.size else 0.0


def noise(kind: str, seconds: float, seed: int = 0, voices: list[np.ndarray] | None = None) -> np.ndarray:
    """Unit-RMS noise of a kind: pink (1/f), babble (other voices over each other; `voices` to draw from)
    or music (chords of harmonic tones that change every half second)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    if kind == "pink":
        spectrum = np.fft.rfft(rng.standard_normal(n))
        f = np.arange(len(spectrum), dtype=np.float64)
        f[0] = 1.0
        out = np.fft.irfft(spectrum / np.sqrt(f), n)
    elif kind == "babble":
        if not voices:
            raise ValueError("babble needs voices to draw from")
        out = np.zeros(n)
        for _ in range(6):  # six talkers, each a string of utterances with short gaps
            pos = int(rng.integers(0, RATE))
            while pos < n:
                clip = voices[int(rng.integers(len(voices)))]
                end = min(n, pos + len(clip))
                out[pos:end] += clip[: end - pos] / max(active_rms(clip), 1e-6)
                pos = end + int(rng.integers(RATE // 20, RATE // 4))
    elif kind == "music":
        out = np.zeros(n)
        t = np.arange(RATE // 2) / RATE
        envelope = np.minimum(1.0, np.minimum(t, t[::-1]) * 40)
        for start in range(0, n, RATE // 2):
            chord = np.zeros_like(t)
            root = 110.0 * 2 ** (int(rng.integers(0, 12)) / 12)
            for ratio in (1.0, 1.26, 1.5, 2.0):  # a major chord with its octave, three harmonics each
                for k, weight in ((1, 1.0), (2, 0.5), (3, 0.25)):
                    chord += weight * np.sin(2 * np.pi * root * ratio * k * t + rng.uniform(0, 2 * np.pi))
            end = min(n, start + len(t))
            out[start:end] = (chord * envelope)[: end - start]
    else:
        raise ValueError(f"unknown noise {kind!r} (choose from {', '.join(NOISE_KINDS)})")
    out = out.astype(np.float32)
    return out / max(float(np.sqrt(np.mean(np.square(out)))), 1e-9)


def overlay(block: np.ndarray, start: int, clip: np.ndarray, at: int) -> None:
    """Add into `block`, the stream's samples from `start`, what falls in it of `clip`, which the stream plays
    from sample `at` (a voice said into a microphone's block)."""
    lo, hi = max(start, at), min(start + len(block), at + len(clip))
    if lo < hi:
        block[lo - start:hi - start] += clip[lo - at:hi - at]


def at_snr(noise_unit: np.ndarray, voice_rms: float, snr_db: float) -> np.ndarray:
    """Noise scaled so the caller's voice stands `snr_db` above it."""
    return noise_unit * np.float32(voice_rms / 10 ** (snr_db / 20))
