"""A downward expander for the ASR in a noisy room: frames well under the caller's voice are taken down.

The suppressor takes a steady noise down by its own estimate of it, but what it leaves between the caller's
words (a noise's peaks, other voices) still stands near the words' own tails, and tiny.en hears words in it.
The caller, nearest the microphone, is the loudest thing in the room, so the expander keys on the loudest
frames of the last 5 s (their 95th percentile: the caller's voice, once they have spoken) and takes every
frame under that less BELOW_DB down by as much again (1:2), at most MAX_CUT_DB. A frame is judged by the
loudest of itself and the HOLD_FRAMES before it, so a word's fall is kept.

Measured with `scripts/noise-candidates.py --cut endpointed` (AMD EPYC, Zen 5, 2026-12-05; 408 words, each
question cut as the call cuts it, three draws of each noise at 10 dB SNR, after WebRTC's near_field), word
error without it and with it: pink noise 0.336/0.284, babble 0.472/0.457. A longer hold (50 ms) or a shorter
reference (3 s, its 90th percentile) lost part of it or harmed. Like the suppressor it is heard
only in a noisy room (`processing.AudioProcessing.noisy`): in a quiet one a soft word is all there is.
"""

from collections import deque

import numpy as np

REFERENCE_FRAMES = 500  # 5 s of 10 ms frames
REFERENCE_PERCENTILE = 95
REFERENCE_EVERY = 10  # frames between two readings of the reference
BELOW_DB = 10.0
MAX_CUT_DB = 30.0
HOLD_FRAMES = 2


class Expander:
    """Frame by frame: the frame, taken down by how far it stands under the caller's voice less BELOW_DB."""

    def __init__(self) -> None:
        self._levels: deque[float] = deque(maxlen=REFERENCE_FRAMES)  # dBFS
        self._recent: deque[float] = deque(maxlen=HOLD_FRAMES + 1)
        self._frames = 0
        self.reference = -100.0  # dBFS: the caller's voice, as the loudest frames of late stand

    def process(self, frame: np.ndarray) -> np.ndarray:
        """`frame` (float32), as the ASR should hear it."""
        level = 10 * float(np.log10(np.dot(frame, frame) / len(frame) + 1e-10))
        self._levels.append(level)
        self._recent.append(level)
        if self._frames % REFERENCE_EVERY == 0:
            self.reference = float(np.percentile(self._levels, REFERENCE_PERCENTILE))
        self._frames += 1
        under = self.reference - BELOW_DB - max(self._recent)
        if under <= 0:
            return frame
        return frame * np.float32(10 ** (-min(under, MAX_CUT_DB) / 20))
