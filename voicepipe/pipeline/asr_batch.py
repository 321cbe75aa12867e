"""Final ASR passes of several calls, run as one engine job.

When many callers stop speaking together, their final passes would queue as separate jobs, each paying
for its own encoder call while the others' callers wait. Requests that arrive while a batch is still
queued join it instead: one job, one encoder call over all of them, each caller gets its own transcript.
"""

import asyncio
import threading
from dataclasses import dataclass, field

import numpy as np

from scheduler import Engine, RequestClass
from voicepipe.backends.base import ASR

MAX_BATCH = 8  # more utterances per job would hold the device longer than one realtime step should


@dataclass(eq=False)
class _Item:
    audio: np.ndarray
    wanted: bool = True  # False once its caller is cancelled: skipped if the job has not started
    text: str = ""


@dataclass(eq=False)
class _Batch:
    items: list[_Item] = field(default_factory=list)
    started: bool = False
    task: "asyncio.Task[None] | None" = None


class ASRBatcher:
    """Shared by every call of one server; `transcribe` is awaited from the event loop.

    The job is queued with the deadline of the request that opened the batch: later requests are final
    passes of utterances that ended later, so their deadlines are no earlier. An ASR backend with a
    `transcribe_batch` method gets the whole batch at once; any other is called utterance by utterance.
    """

    def __init__(self, engine: Engine, asr: ASR, kind: str = "asr_final") -> None:
        self.engine, self.asr, self.kind = engine, asr, kind
        self._open: _Batch | None = None
        self._lock = threading.Lock()  # the job runs on the engine thread, requests join on the loop's
        self._tasks: set[asyncio.Task] = set()

    async def transcribe(self, audio: np.ndarray, deadline: float | None) -> str:
        """The transcript of `audio` (at the ASR's sample rate), from a job shared with concurrent callers."""
        item = _Item(audio)
        batch = self._join(item, deadline)
        try:
            await asyncio.shield(batch.task)
        except asyncio.CancelledError:
            item.wanted = False
            raise
        return item.text

    def _join(self, item: _Item, deadline: float | None) -> _Batch:
        with self._lock:
            batch = self._open
            if batch is not None and not batch.started and len(batch.items) < MAX_BATCH:
                batch.items.append(item)
                return batch
            batch = self._open = _Batch([item])
        batch.task = asyncio.ensure_future(self.engine.run_job(lambda: self._run(batch), RequestClass.REALTIME,
                                                               deadline, self.kind))
        self._tasks.add(batch.task)
        batch.task.add_done_callback(self._finished)
        return batch

    def _run(self, batch: _Batch) -> None:
        with self._lock:
            batch.started = True
            if self._open is batch:
                self._open = None
            items = [item for item in batch.items if item.wanted]
        if not items:
            return
        many = getattr(self.asr, "transcribe_batch", None)
        audios = [item.audio for item in items]
        texts = many(audios) if many is not None else [self.asr.transcribe(audio) for audio in audios]
        for item, text in zip(items, texts, strict=True):
            item.text = text or ""

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # every caller already saw it, or none is left to: either way it is handled
