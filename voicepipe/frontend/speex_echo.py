"""Speex's echo canceller (MDF, a frequency-domain adaptive filter) from the system's libspeexdsp, bound with
ctypes: five calls of its C API, so no binding package is needed.

Its output is the microphone less the echo its linear filter predicts, and nothing else: a caller talking
over the echo passes untouched (measured in the synthetic rooms: within 0.5 dB of their own voice, where
AEC3's output had taken a median 15-24 dB off them). It needs many seconds of reply audio to learn a room
and has no delay estimation of its own, so `frontend/linear_stage.py` decides when its output is trusted.
"""

import ctypes
import ctypes.util
import functools
import logging
import weakref

import numpy as np

log = logging.getLogger(__name__)
SET_SAMPLING_RATE = 24  # speex_echo.h: SPEEX_ECHO_SET_SAMPLING_RATE


@functools.cache
def library() -> ctypes.CDLL | None:
    """libspeexdsp, or None (logged once) where the system lacks it (Debian's `libspeexdsp1`)."""
    for name in (ctypes.util.find_library("speexdsp"), "libspeexdsp.so.1", "libspeexdsp.dylib"):
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            continue
        if lib is not None and hasattr(lib, "speex_echo_state_init"):
            _declare(lib)
            return lib
    log.warning("libspeexdsp not found (apt install libspeexdsp1): echo cancellation runs AEC3 alone")
    return None


def _declare(lib: ctypes.CDLL) -> None:
    samples = ctypes.POINTER(ctypes.c_int16)
    lib.speex_echo_state_init.restype = ctypes.c_void_p
    lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_cancellation.restype = None
    lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p, samples, samples, samples]
    lib.speex_echo_ctl.restype = ctypes.c_int
    lib.speex_echo_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.speex_echo_state_reset.restype = None
    lib.speex_echo_state_reset.argtypes = [ctypes.c_void_p]
    lib.speex_echo_state_destroy.restype = None
    lib.speex_echo_state_destroy.argtypes = [ctypes.c_void_p]


class SpeexEcho:
    """One call's linear canceller over `frame`-sample frames, its filter `tail` samples long (the echo's
    delay past the far end's timing plus the room's reverberation)."""

    def __init__(self, lib: ctypes.CDLL, rate: int, frame: int, tail: int) -> None:
        self.frame = frame
        state = lib.speex_echo_state_init(frame, tail)
        if not state:
            raise RuntimeError(f"speex_echo_state_init({frame}, {tail}) failed")
        lib.speex_echo_ctl(state, SET_SAMPLING_RATE, ctypes.byref(ctypes.c_int(rate)))
        self._lib, self._state = lib, state
        self._out = np.zeros(frame, np.int16)
        weakref.finalize(self, lib.speex_echo_state_destroy, state)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        """The microphone frame `near` (float32) less the echo of the far end's frames up to `far`."""
        rec, play = (np.ascontiguousarray(np.clip(x * 32767.0, -32768, 32767).astype(np.int16)) for x in (near, far))
        pointer = ctypes.POINTER(ctypes.c_int16)
        self._lib.speex_echo_cancellation(self._state, rec.ctypes.data_as(pointer), play.ctypes.data_as(pointer),
                                          self._out.ctypes.data_as(pointer))
        return self._out.astype(np.float32) / np.float32(32768.0)

    def reset(self) -> None:
        """Forget the room: the filter starts again from nothing."""
        self._lib.speex_echo_state_reset(self._state)
