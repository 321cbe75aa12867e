"""Piper speech synthesis (a VITS voice in ONNX, phonemized by the espeak-ng built into piper-tts)."""

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from voicepipe.backends.models import ModelError, first_line, resolve_tts
from voicepipe.backends.threads import onnx_options


class PiperTTS:
    """Text in, one int16 chunk per sentence out, at the voice's own sample rate; and where each word of it
    ends in the audio, from the voice's own phoneme durations.

    The ONNX session is built here rather than by `PiperVoice.load` so its thread pool does not spin:
    a spinning pool fights torch and CTranslate2 for the same cores, and with spinning off the first
    sentence arrived sooner (about 0.3 s against 0.4-0.7 s) on a busy 2-core machine. The voice is patched
    in memory to output its phonemes' sample counts (piper's own patch, with the `onnx` package; about a
    second at load); a voice that cannot be patched still speaks, without word timings.
    """

    def __init__(self, voice_path: str | Path | None = None, threads: int = 2) -> None:
        import onnxruntime
        from piper import PiperConfig, PiperVoice

        onnx = resolve_tts(voice_path)
        options = onnx_options(threads)
        try:
            config = PiperConfig.from_dict(json.loads(Path(f"{onnx}.json").read_text(encoding="utf-8")))
            model, self.timed = _with_alignments(onnx)
            session = onnxruntime.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as e:  # a broken voice file fails in many ways: report it in one line
            raise ModelError(f"cannot load TTS voice {onnx}: {first_line(e)}") from None
        self.voice = PiperVoice(session=session, config=config)
        self.sample_rate: int = config.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield int16 mono audio, one chunk per sentence of `text`."""
        for chunk in self.voice.synthesize(text):
            yield chunk.audio_int16_array

    def synthesize_words(self, text: str) -> tuple[list[np.ndarray], list[float] | None]:
        """The chunks of `text`, and when each of its words (`text.split()`) ends, in seconds from the start
        of its audio (None where the voice has no timings). Written and spoken words differ ("21" is two
        spoken, "in the" one), so each written word ends where the spoken words of the text up to it do:
        each prefix of the text is phonemized alone to count them."""
        chunks, spoken, at = [], [], 0  # spoken: where each phonemized word ends, in samples
        for chunk in self.voice.synthesize(text, include_alignments=self.timed):
            chunks.append(chunk.audio_int16_array)
            if chunk.phoneme_alignments is None:
                spoken = None
            elif spoken is not None:
                spoken += [at + end for end in _word_ends(chunk.phoneme_alignments)]
            at += len(chunk.audio_int16_array)
        if not spoken:
            return chunks, None
        written = text.split()
        counts = [sum(len("".join(s).split()) for s in self.voice.phonemize(" ".join(written[:n + 1])))
                  for n in range(len(written))]
        ends = [spoken[min(max(count, 1), len(spoken)) - 1] / self.sample_rate for count in counts]
        return chunks, _shared(ends, written)

def _with_alignments(path: Path) -> tuple[bytes | str, bool]:
    """The voice's model with its phonemes' sample counts as an output (and True), or its path (and False)
    where that cannot be done."""
    try:
        import onnx
        from piper.patch_voice_with_alignment import add_alignment_output

        model = onnx.load(str(path))
        add_alignment_output(model)
        return model.SerializeToString(), True
    except Exception:  # noqa: BLE001 - no onnx, or a graph the patch does not know: speak without timings
        return str(path), False


def _word_ends(alignments: list) -> list[int]:
    """Where each word of one chunk ends, in samples from the chunk's start: at each space between words,
    and after the last word's phonemes (before the closing punctuation and the end marker)."""
    ends, at, in_word = [], 0, False
    for alignment in alignments:
        phoneme = alignment.phoneme
        if phoneme == " " or phoneme in "^$" or not phoneme.strip(".,;:!?¡¿—-\"'"):
            if in_word and phoneme != "^":
                ends.append(at)
            in_word = False
        else:
            in_word = True
        at += int(alignment.num_samples)
    if in_word:
        ends.append(at)
    return ends


def _shared(ends: list[float], words: list[str]) -> list[float]:
    """Written words spoken as one ("on the") share that spoken word's time, by their letters."""
    out, n = list(ends), 0
    while n < len(out):
        last = n
        while last + 1 < len(out) and out[last + 1] == out[n]:
            last += 1
        if last > n:
            start = out[n - 1] if n else 0.0
            letters = [len(w) for w in words[n:last + 1]]
            total, so_far = sum(letters), 0
            for k, count in enumerate(letters):
                so_far += count
                out[n + k] = start + (ends[n] - start) * so_far / total
        n = last + 1
    return out
