"""A phone call's audio between the wire and the pipeline: the caller's G.711 at 8 kHz to the ASR's 16 kHz
PCM16 (a lost packet's length of silence put in first, so the caller's clock holds), and the reply from the
TTS's rate to the call's G.711."""

import numpy as np
import soxr

from voicepipe.audio import SAMPLE_RATE
from voicepipe.wire_audio import WireAudio


class PhoneAudio:
    def __init__(self, codec: WireAudio, tts_rate: int) -> None:
        self.codec, self.tts_rate = codec, tts_rate
        self._mic = soxr.ResampleStream(codec.rate, SAMPLE_RATE, 1, dtype="int16")
        self._speaker: soxr.ResampleStream | None = None  # one per reply, flushed at its end

    def heard(self, coded: bytes, gap: int = 0) -> bytes:
        """One packet of the caller's, after `gap` packets lost: PCM16 at the pipeline's rate."""
        samples = self.codec.decode(coded)
        if gap:
            samples = np.concatenate([np.zeros(gap * len(samples), np.int16), samples])
        return self._mic.resample_chunk(samples).astype("<i2").tobytes()

    def spoken(self, pcm: bytes, last: bool = False) -> bytes:
        """Reply audio (PCM16 at the TTS's rate) as the call's G.711; `last` flushes the reply's end."""
        if self._speaker is None:
            if last:
                return b""
            self._speaker = soxr.ResampleStream(self.tts_rate, self.codec.rate, 1, dtype="int16")
        audio = self._speaker.resample_chunk(np.frombuffer(pcm, "<i2"), last=last).astype(np.int16)
        if last:
            self._speaker = None
        return self.codec.encode(audio)

    def cut(self) -> None:
        """The caller barged in: the reply's resampler starts again with the next reply."""
        self._speaker = None
