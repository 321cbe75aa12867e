"""A call's microphone and far end as its audio front end was given them, kept to be replayed offline
(`voicepipe bench replay`): where a call in a real room misbehaved (the echo barged in, a caller went
unheard), the front end's and the VAD's every step can be run again, and changed, on what it heard.

Found so: a far end that forgot what was playing, and a filter left one sample out of line
(docs/audio-front-end.md). A call's recording is its audio in memory (128 kB a second) until it ends, so
MAX_S bounds it.
"""

import json
from pathlib import Path

import numpy as np

from voicepipe.frontend.reference import RATE

MAX_S = 600.0
Settings = tuple[int, bool, str | None]  # from which sample: the canceller on, the suppressor's setting


class FrontEndRecording:
    """The microphone's samples, the far end's beside them, where the far end started anew, and the front
    end's settings as they changed."""

    def __init__(self, max_s: float = MAX_S) -> None:
        self._near: list[np.ndarray] = []
        self._far: list[np.ndarray] = []
        self._restarts: list[int] = []
        self._settings: list[Settings] = []
        self._samples = 0
        self._max = int(max_s * RATE)

    @property
    def samples(self) -> int:
        return self._samples

    def add(self, near: np.ndarray, far: np.ndarray, restart: int | None, echo: bool, noise: str | None) -> None:
        """One piece as the processing got it (`restart`: where in it the far end starts anew), under the
        settings `echo` and `noise`."""
        if self._samples + len(near) > self._max:
            return
        if not self._settings or self._settings[-1][1:] != (echo, noise):
            self._settings.append((self._samples, echo, noise))
        if restart is not None:
            self._restarts.append(self._samples + restart)
        self._near.append(np.array(near, np.float32))
        self._far.append(np.array(far, np.float32))
        self._samples += len(near)

    def save(self, path: Path) -> None:
        """Written whole or not at all: a replay never reads one half written."""
        path.parent.mkdir(parents=True, exist_ok=True)
        empty = np.zeros(0, np.float32)
        part = path.with_name(path.stem + ".part.npz")
        np.savez_compressed(part, near=np.concatenate(self._near) if self._near else empty,
                            far=np.concatenate(self._far) if self._far else empty,
                            restarts=np.array(self._restarts, np.int64), settings=json.dumps(self._settings))
        part.replace(path)


def load(path: Path) -> tuple[np.ndarray, np.ndarray, list[int], list[Settings]]:
    """A recording's microphone, far end, fresh starts, and the front end's settings from where each began."""
    with np.load(path) as saved:
        settings = [(int(at), bool(echo), noise) for at, echo, noise in json.loads(str(saved["settings"]))]
        return saved["near"], saved["far"], saved["restarts"].tolist(), settings
