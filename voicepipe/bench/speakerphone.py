"""A speakerphone: what its loudspeaker plays of the reply audio, and what its microphone hears of that
through a room. A stand-in for a real loudspeaker and microphone, which cannot exist here.

The loudspeaker plays each chunk of reply audio from its arrival, after what is still queued (one stream,
as a player's sound card plays it), and drops its queue when the server says `output_audio_buffer.cleared`,
as the protocol asks. Positions are in 16 kHz samples of the microphone stream, from the call's start. The
microphone adds its own noise, as every real one does (a laptop's sits around -70 dBFS): a raw microphone
never sends digital silence.
"""

import numpy as np

from voicepipe.audio import resample
from voicepipe.bench.phone_line import down_the_line
from voicepipe.bench.room import RATE, Room, active_rms

SELF_NOISE = np.float32(10 ** (-70 / 20))  # the microphone's own noise, RMS: -70 dBFS


class Loudspeaker:
    """`reply_rms`: the level the reply audio plays at (its voice's), so the echo comes back `room.echo_db`
    from `voice_rms`, the caller's. On a phone line (`phone`) it plays what the line delivers of the reply
    (`bench.phone_line`); `played` stays the reply as sent, the server's far end."""

    def __init__(self, room: Room, voice_rms: float, reply_rms: float, phone: bool = False) -> None:
        self.response = room.impulse_response()
        path_gain = float(np.sqrt(np.sum(np.square(self.response, dtype=np.float64))))
        self.gain = np.float32(voice_rms * 10 ** (room.echo_db / 20) / (reply_rms * path_gain))
        self.played = np.zeros(0, np.float32)
        self._line = np.zeros(0, np.float32) if phone else None  # what the line delivered of `played`
        self.queue_end = 0
        self._run: tuple[int, int, np.ndarray] | None = None  # the playing stream: its start, rate, audio so far
        self._size = 1 << int(np.ceil(np.log2(2 * len(self.response) + 2 * RATE)))  # FFT size for echo()
        self._spectrum = np.fft.rfft(self.response, self._size)
        self._hiss = np.random.default_rng(room.seed).standard_normal(RATE).astype(np.float32) * SELF_NOISE

    def receive(self, pcm: np.ndarray, rate: int, at: int) -> None:
        """Reply audio (PCM16 at `rate`) arrived when the microphone was at sample `at`: played after what is
        still queued, as one stream with it (the run resampled whole again), or from now after a gap."""
        audio = pcm.astype(np.float32) / 32768.0
        if at > self.queue_end or self._run is None or self._run[1] != rate:
            self._run = (max(at, self.queue_end), rate, audio)
        else:
            self._run = (self._run[0], rate, np.concatenate([self._run[2], audio]))
        start, _, heard = self._run
        played = resample(heard, rate, RATE)
        self.played = placed(self.played, start, played)
        if self._line is not None:
            self._line = placed(self._line, start, down_the_line(played, RATE))
        self.queue_end = start + len(played)

    def clear(self, at: int) -> None:
        """The queue is dropped at sample `at`."""
        self.played, self.queue_end, self._run = self.played[:at], at, None
        if self._line is not None:
            self._line = self._line[:at]

    def playing(self, at: int) -> bool:
        return self.queue_end > at

    def echo(self, end: int, n: int) -> np.ndarray:
        """The `n` samples up to `end` the microphone hears of what the loudspeaker played, over its own
        noise."""
        span = len(self.response) + n
        window = np.zeros(span, np.float32)
        lo = max(0, end - span)
        sounding = self.played if self._line is None else self._line
        part = sounding[lo:min(end, len(sounding))]
        window[span - (end - lo): span - (end - lo) + len(part)] = part
        heard = np.fft.irfft(np.fft.rfft(window, self._size) * self._spectrum, self._size)[span - n: span]
        hiss = np.resize(np.roll(self._hiss, -(end - n) % RATE), n)
        return heard.astype(np.float32) * self.gain + hiss


def placed(stream: np.ndarray, start: int, audio: np.ndarray) -> np.ndarray:
    """`stream` with `audio` written from `start`, grown with silence where it ends before it."""
    end = start + len(audio)
    if len(stream) < end:
        stream = np.concatenate([stream, np.zeros(end - len(stream), np.float32)])
    stream[start:end] = audio
    return stream


def reply_level(samples: list[np.ndarray]) -> float:
    """The level a voice's speech plays at: the active RMS of some of its sentences (float32)."""
    return active_rms(np.concatenate(samples))
