"""Whisper speech recognition through faster-whisper (CTranslate2)."""

from pathlib import Path

import numpy as np

from voicepipe.backends.models import resolve_asr
from voicepipe.backends.whisper_trimmed import TrimmedWhisper

# int8 by default, by measurement over the trimmed window: on the 96 spoken questions of the tests the
# word error rate was 0.176 for int8 against 0.183 for float32, and on a quiet 2-core machine a pass over
# a short question took 116 ms against 213 ms (median of 30, the two alternated).
DEFAULT_COMPUTE_TYPE = "int8"


class WhisperASR:
    """One utterance in, its English transcript out; or several in one pass with `transcribe_batch`.

    Passes run over a window trimmed to the utterance (see `whisper_trimmed`); an utterance whose trimmed
    transcript loops, or that is longer than one window, is transcribed by faster-whisper's full pass.
    That pass is greedy (beam 1) with no internal VAD, since the pipeline endpoints speech itself, and no
    conditioning on previous text, which only feeds earlier mistakes back in for single utterances.
    """

    sample_rate = 16000

    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu",
                 compute_type: str = DEFAULT_COMPUTE_TYPE, cpu_threads: int = 2) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(resolve_asr(model_dir)), device=device, compute_type=compute_type,
                                  cpu_threads=cpu_threads, num_workers=1)
        self.trimmed = TrimmedWhisper(self.model)

    def transcribe(self, audio: np.ndarray) -> str:
        """Transcribe float32 mono audio at 16 kHz; silence or empty audio gives ""."""
        return self.transcribe_batch([audio])[0]

    def transcribe_batch(self, batch: list[np.ndarray]) -> list[str]:
        """Transcribe several utterances with one encoder call and one batched decode for those that fit."""
        batch = [np.asarray(audio, dtype=np.float32) for audio in batch]
        texts: list[str | None] = [None if audio.size else "" for audio in batch]
        short = [i for i, audio in enumerate(batch) if audio.size and self.trimmed.fits(audio.size)]
        if short:
            for i, text in zip(short, self.trimmed.decode([batch[i] for i in short]), strict=True):
                texts[i] = text
        return [self.full_pass(audio) if text is None else text for audio, text in zip(batch, texts, strict=True)]

    def full_pass(self, audio: np.ndarray) -> str:
        """faster-whisper's own transcription, over 30 s windows."""
        segments, _ = self.model.transcribe(audio, language="en", beam_size=1, vad_filter=False,
                                            condition_on_previous_text=False)
        return " ".join(s.text.strip() for s in segments).strip()
