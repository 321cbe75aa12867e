"""Reply audio on its way to the speaker: a ring buffer shared by the event loop and the sound card's thread."""

import threading

import numpy as np


class PlaybackBuffer:
    """PCM16 samples written by the call's event loop and read by the output stream's callback.

    The callback runs on PortAudio's thread and must never wait, so each side holds the lock only to copy
    samples, and nothing allocates there. `clear` drops everything queued at once, for a barge-in.
    Samples that do not fit are dropped and counted: the reply plays on, shortened, rather than stalling
    the call.
    """

    def __init__(self, capacity: int) -> None:
        self._data = np.zeros(capacity, np.int16)
        self._start = 0  # where the next sample to play is
        self._size = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def __len__(self) -> int:
        return self._size

    def write(self, pcm: np.ndarray) -> None:
        with self._lock:
            capacity = len(self._data)
            fits = min(len(pcm), capacity - self._size)
            self.dropped += len(pcm) - fits
            end = (self._start + self._size) % capacity
            first = min(fits, capacity - end)
            self._data[end:end + first] = pcm[:first]
            self._data[:fits - first] = pcm[first:fits]
            self._size += fits

    def read_into(self, out: np.ndarray) -> int:
        """Fill `out` with the next samples, silence after the last one; returns how many were real."""
        with self._lock:
            capacity = len(self._data)
            n = min(len(out), self._size)
            first = min(n, capacity - self._start)
            out[:first] = self._data[self._start:self._start + first]
            out[first:n] = self._data[:n - first]
            self._start = (self._start + n) % capacity
            self._size -= n
        out[n:] = 0
        return n

    def clear(self) -> int:
        """Drop every queued sample; returns how many there were."""
        with self._lock:
            queued, self._size = self._size, 0
        return queued
