"""A call's microphone and far end as its audio front end was given them, kept to be replayed offline
(`voicepipe bench replay`): where a call in a real room misbehaved (the echo barged in, a caller went
unheard), the front end's and the VAD's every step can be run again, and changed, on what it heard.

Found so: a far end that forgot what was playing, and a filter left one sample out of line
(docs/audio-front-end.md). A call's recording is its audio in memory (128 kB a second) until it ends, so
MAX_S bounds it.
"""

from pathlib import Path

import numpy as np

RATE = 16000
MAX_S = 600.0


class FrontEndRecording:
    """The microphone's samples, the far end's beside them, and where the far end started anew."""

    def __init__(self, max_s: float = MAX_S) -> None:
        self._near: list[np.ndarray] = []
        self._far: list[np.ndarray] = []
        self._restarts: list[int] = []
        self._samples = 0
        self._max = int(max_s * RATE)

    @property
    def samples(self) -> int:
        return self._samples

    def add(self, near: np.ndarray, far: np.ndarray, restart: int | None) -> None:
        """One piece as the processing got it (`restart`: where in it the far end starts anew)."""
        if self._samples + len(near) > self._max:
            return
        if restart is not None:
            self._restarts.append(self._samples + restart)
        self._near.append(np.array(near, np.float32))
        self._far.append(np.array(far, np.float32))
        self._samples += len(near)

    def save(self, path: Path, echo: bool, noise: str | None) -> None:
        """Written with the front end's settings (`echo`, `noise`) as the call ended."""
        path.parent.mkdir(parents=True, exist_ok=True)
        empty = np.zeros(0, np.float32)
        part = path.with_name(path.stem + ".part.npz")  # (a replay never reads one half written)
        np.savez_compressed(part, near=np.concatenate(self._near) if self._near else empty,
                            far=np.concatenate(self._far) if self._far else empty,
                            restarts=np.array(self._restarts, np.int64), echo=echo, noise=noise or "")
        part.replace(path)


def load(path: Path) -> tuple[np.ndarray, np.ndarray, list[int], bool, str | None]:
    """A recording's microphone, far end, fresh starts, and the front end's settings."""
    with np.load(path) as saved:
        noise = str(saved["noise"])
        return saved["near"], saved["far"], saved["restarts"].tolist(), bool(saved["echo"]), noise or None
