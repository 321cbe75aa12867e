"""Coqui TTS speech synthesis from a local model directory: a config.json beside a checkpoint.

An optional backend: it needs the `coqui` extra, installed by `.ci/setup-coqui.sh` (which also makes
torchaudio import on a CPU-only torch). `TTS` is imported only when a model is loaded, so this module
imports without the extra.

Nothing is ever fetched: a config that names a remote file is refused, as are the model types that
download parts of themselves while loading, and the model is built from the directory's own files.
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.backends.models import ModelError, first_line

INSTALL_HINT = "install the coqui extra: bash .ci/setup-coqui.sh"

# Tried in this order; otherwise the highest checkpoint_<step>.pth, or the only .pth there is.
_CHECKPOINT_NAMES = ("model.pth", "best_model.pth", "model_file.pth", "checkpoint.pth")
_STEP_CHECKPOINT = re.compile(r"checkpoint_(\d+)\.pth")
# These load from the whole directory (checkpoint, vocabulary, speaker files) rather than one file.
_DIRECTORY_MODELS = {"xtts"}
# These download their sub-models at load time, which cannot work here.
_DOWNLOADING_MODELS = {"bark", "tortoise"}
# Schemes Coqui's file loading (fsspec) would fetch; a training config also holds e.g. a tcp:// rendezvous.
_REMOTE = re.compile(r"^(https?|s?ftp|hf|s3|gs|gcs|az|abfs|github)://", re.IGNORECASE)


def resolve_coqui(path: str | Path) -> tuple[Path, Path, dict[str, Any]]:
    """Check a Coqui model directory before any slow import: (checkpoint, config.json, parsed config).

    The checkpoint is the directory itself for models that load from a directory.
    """
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise ModelError(f"Coqui TTS model {model_dir} is not a directory")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelError(f"Coqui TTS model {model_dir} has no config.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"Coqui TTS config {config_path} is unreadable: {first_line(e)}") from None
    if not isinstance(config, dict) or not isinstance(config.get("audio"), dict):
        raise ModelError(f"Coqui TTS config {config_path} has no audio section")
    model_type = str(config.get("model", ""))
    if model_type in _DOWNLOADING_MODELS:
        raise ModelError(f"Coqui TTS model type '{model_type}' fetches parts of itself at load time: not supported")
    remote = next(_remote_refs(config), None)
    if remote is not None:
        raise ModelError(f"Coqui TTS config {config_path} refers to a remote file {remote}: only local files are used")
    if model_type in _DIRECTORY_MODELS:
        return model_dir, config_path, config
    return _checkpoint(model_dir), config_path, config


def _checkpoint(model_dir: Path) -> Path:
    """The checkpoint file of a single-file model directory."""
    for name in _CHECKPOINT_NAMES:
        if (model_dir / name).is_file():
            return model_dir / name
    steps = [(int(m.group(1)), p) for p in model_dir.glob("checkpoint_*.pth")
             if (m := _STEP_CHECKPOINT.fullmatch(p.name)) and p.is_file()]
    if steps:
        return max(steps)[1]
    found = [p for p in model_dir.glob("*.pth") if p.is_file()]
    if len(found) == 1:
        return found[0]
    if found:
        raise ModelError(f"Coqui TTS model {model_dir} holds {len(found)} .pth files; name the one to use model.pth")
    raise ModelError(f"Coqui TTS model {model_dir} has no checkpoint (expected model.pth or best_model.pth)")


def _remote_refs(value: Any) -> Iterator[str]:
    """Every string in a config that is a remote file's URL, which Coqui would otherwise download."""
    if isinstance(value, str):
        if _REMOTE.match(value):
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _remote_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _remote_refs(item)


class CoquiTTS:
    """Text in, one int16 chunk per sentence out, at the model's output rate, on the CPU.

    Sentences come from Coqui's own splitter (pySBD, which knows abbreviations such as "Dr."), and each
    is synthesized and yielded on its own, so playback starts after the first one instead of the last.
    """

    def __init__(self, model_dir: str | Path, speaker: str | None = None, language: str | None = None) -> None:
        checkpoint, config_path, config = resolve_coqui(model_dir)
        try:
            from TTS.api import TTS as CoquiAPI
        except Exception as e:  # not installed, or torchaudio's CUDA extension on a CPU torch (an OSError)
            raise ModelError(f"Coqui TTS is not importable ({first_line(e)}); {INSTALL_HINT}") from None
        try:
            self._api = CoquiAPI(model_path=str(checkpoint), config_path=str(config_path), progress_bar=False)
        except Exception as e:  # a broken checkpoint or config fails in many ways: report it in one line
            raise ModelError(f"cannot load Coqui TTS model {checkpoint}: {first_line(e)}") from None
        synthesizer = self._api.synthesizer
        audio = config["audio"]
        # The synthesizer's rate is the config's output_sample_rate, else its sample_rate.
        self.sample_rate: int = int(getattr(synthesizer, "output_sample_rate", None)
                                    or audio.get("output_sample_rate") or audio["sample_rate"])
        # A multi-speaker or multi-lingual model needs a speaker and a language: default to its first ones.
        self._speaker = speaker or (_first(self._api.speakers) if self._api.is_multi_speaker else None)
        self._language = language or (_first(self._api.languages) if self._api.is_multi_lingual else None)

    def sentences(self, text: str) -> list[str]:
        """The sentences of `text` as Coqui splits them, without empty ones."""
        if not text.strip():
            return []
        split = self._api.synthesizer.split_into_sentences(text, self._language)
        return [s.strip() for s in split if s.strip()]

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield int16 mono audio, one chunk per sentence of `text`, each as soon as it is made."""
        for sentence in self.sentences(text):
            wav = self._api.tts(sentence, speaker=self._speaker, language=self._language, split_sentences=False)
            yield _to_int16(wav)


def _first(names: list[str] | None) -> str | None:
    """The first of a model's speaker or language names, if it lists any."""
    return names[0] if names else None


def _to_int16(wav: Any) -> np.ndarray:
    """Float samples in [-1, 1] to int16, without the run of zeros Coqui appends to join sentences.

    That padding is meant for one concatenated file; between streamed chunks it would only add a gap.
    """
    samples = np.trim_zeros(np.asarray(wav, dtype=np.float32).reshape(-1), "b")
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
