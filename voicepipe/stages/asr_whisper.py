"""Whisper speech recognition through faster-whisper (CTranslate2)."""

from pathlib import Path

import numpy as np

from voicepipe.models import resolve_asr

# float32 by default, for accuracy: int8 misheard the reference question ("What is the capital on
# France?") where float32 got it right. Speed does not settle it on a 2-core CPU: a pass costs about the
# same whatever the clip (Whisper pads to 30 s); idle, the two types measured alike, and on a busy
# machine int8 took 1.1-1.2 s against 1.3-2.5 s for float32.
DEFAULT_COMPUTE_TYPE = "float32"


class WhisperASR:
    """One utterance in, its English transcript out.

    Decoding is greedy (beam 1) with no internal VAD, since the pipeline endpoints speech itself, and no
    conditioning on previous text, which only feeds earlier mistakes back in for single utterances.
    """

    sample_rate = 16000

    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu",
                 compute_type: str = DEFAULT_COMPUTE_TYPE, cpu_threads: int = 2) -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(str(resolve_asr(model_dir)), device=device, compute_type=compute_type,
                                  cpu_threads=cpu_threads, num_workers=1)

    def transcribe(self, audio: np.ndarray) -> str:
        """Transcribe float32 mono audio at 16 kHz; silence or empty audio gives ""."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.size == 0:
            return ""
        segments, _ = self.model.transcribe(audio, language="en", beam_size=1, vad_filter=False,
                                            condition_on_previous_text=False)
        return " ".join(s.text.strip() for s in segments).strip()
