"""A run of back-to-back chunks resampled to 16 kHz as one stream, each chunk's audio given as it comes.

A stream resampler holds a chunk's last samples back until the next one comes (the filter needs what
follows them), and a run's last chunk has no next one to bring them: the end of every sentence before a
pause would be missing from the far end. Resampled on its own, each chunk's samples fall where its own first
sample does, up to half a sample off the run's grid. So each chunk is resampled on its own together with
the run's audio just before it, from an input sample that falls on an output sample (rates `p`:`q` in
lowest terms line up every `p` input samples), and its output goes from past that context's edge; its own
last samples, computed as if nothing followed, are written again by the next chunk's.
"""

from math import gcd

import numpy as np
import soxr

from voicepipe.audio import SAMPLE_RATE as RATE

CONTEXT_S = 0.08  # the run's audio resampled again before each chunk: well past the filter's reach
EDGE_S = 0.03  # of which the output's first samples (the context's own edge) are not used


class RunResampler:
    """One run's chunks at `rate` in, at 16 kHz out: `add` gives each chunk's output and the run's sample
    it starts at; outputs overlap, and a later one's samples stand for an earlier one's."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        common = gcd(rate, RATE)
        self._in_period, self._out_period = rate // common, RATE // common
        self._context = -(-int(CONTEXT_S * rate) // self._in_period) * self._in_period
        self._edge = int(EDGE_S * RATE)
        self._history = np.zeros(0, np.float32)  # the run's latest input samples
        self._history_from = 0  # the run's input sample the history starts at
        self._fed = 0  # input samples of the run so far

    def add(self, samples: np.ndarray) -> tuple[int, np.ndarray]:
        """`samples` (float32) follow the run's last ones: their 16 kHz audio, from the run's sample returned."""
        if self.rate == RATE:
            at, self._fed = self._fed, self._fed + len(samples)
            return at, samples
        start = max(0, (self._fed - self._context) // self._in_period * self._in_period)
        block = np.concatenate([self._history[start - self._history_from:], samples])
        out = soxr.resample(block, self.rate, RATE).astype(np.float32, copy=False)
        skip = 0 if start == 0 else min(self._edge, len(out))
        self._fed += len(samples)
        keep_from = max(0, self._fed - self._context - self._in_period)
        self._history = block[keep_from - start:]
        self._history_from = keep_from
        return start // self._in_period * self._out_period + skip, out[skip:]
