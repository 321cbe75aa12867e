"""Audio at the edges of the pipeline: float32 mono inside, PCM16 WAV in files and on the wire.

Reading prefers `soundfile` when it is installed (it also reads FLAC and Ogg). Without it a small RIFF
reader takes over: the stdlib `wave` module of Python 3.11 refuses IEEE-float and WAVE_FORMAT_EXTENSIBLE
files, which common tools write, so it is used for writing only.
"""

import io
import struct
import wave
from pathlib import Path

import numpy as np
import soxr

SAMPLE_RATE = 16000  # the pipeline's rate: the VAD, the ASR and every call's audio inside

try:
    import soundfile
except ImportError:  # optional: the RIFF reader below covers WAV
    soundfile = None

_WAVE_PCM, _WAVE_FLOAT, _WAVE_EXTENSIBLE = 1, 3, 0xFFFE


class AudioError(ValueError):
    """A file that cannot be used as audio; the message is one line, fit to show a user."""


def read_audio(path: str | Path, sample_rate: int) -> np.ndarray:
    """Read an audio file as float32 mono in [-1, 1] at `sample_rate`, whatever its own format."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise AudioError(f"cannot read {path}: {e.strerror or e}") from None
    if not data:
        raise AudioError(f"{path} is empty")
    try:
        samples, rate = _decode(data)
    except (ValueError, RuntimeError, struct.error) as e:
        raise AudioError(f"{path} is not a readable audio file ({e})") from None
    if samples.size == 0:
        raise AudioError(f"{path} contains no audio samples")
    return resample(samples, rate, sample_rate)


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    """Decode file bytes to float32 mono and its sample rate."""
    if soundfile is None:
        return _decode_riff(data)
    frames, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return frames.mean(axis=1, dtype=np.float32), rate


def _decode_riff(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a RIFF/WAVE file holding 8/16/24/32-bit integer PCM or 32/64-bit float samples."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a WAV file")
    fmt = pcm = None
    pos = 12
    while pos + 8 <= len(data) and pcm is None:
        chunk_id, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        if chunk_id == b"fmt ":
            fmt = data[pos + 8:pos + 8 + size]
        elif chunk_id == b"data":
            pcm = data[pos + 8:pos + 8 + size]  # a streamed file's size may overstate: slicing trims it
        pos += 8 + size + (size & 1)
    if fmt is None or pcm is None:
        raise ValueError("no fmt or data chunk")
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == _WAVE_EXTENSIBLE:
        tag = int.from_bytes(fmt[24:26], "little")  # the sub-format GUID starts with the plain tag
    if channels == 0 or rate == 0:
        raise ValueError("no channels or no sample rate")
    samples = _pcm_to_float(pcm, tag, bits)
    frames = samples[: samples.size // channels * channels].reshape(-1, channels)
    return frames.mean(axis=1, dtype=np.float32), rate


def _pcm_to_float(pcm: bytes, tag: int, bits: int) -> np.ndarray:
    """Interleaved samples as float32 in [-1, 1]."""
    width = bits // 8
    pcm = pcm[: len(pcm) // width * width] if width else b""
    if tag == _WAVE_FLOAT and bits in (32, 64):
        return np.frombuffer(pcm, f"<f{width}").astype(np.float32)
    if tag != _WAVE_PCM or bits not in (8, 16, 24, 32):
        raise ValueError(f"unsupported sample format (format tag {tag}, {bits} bits)")
    if bits == 8:
        return (np.frombuffer(pcm, np.uint8).astype(np.float32) - 128.0) / 128.0
    if bits == 24:
        b = np.frombuffer(pcm, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8  # shift up and back to sign-extend
        return ints.astype(np.float32) / float(1 << 23)
    ints = np.frombuffer(pcm, f"<i{width}")
    return ints.astype(np.float32) / float(1 << (bits - 1))


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Float32 audio at `to_rate`; a no-op when the rates already match."""
    audio = np.asarray(audio, dtype=np.float32)
    if from_rate == to_rate:
        return audio
    return soxr.resample(audio, from_rate, to_rate).astype(np.float32, copy=False)


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] as int16, clipped rather than wrapped when they overshoot.

    The scale is 32768 both ways, so int16 -> float32 -> int16 gives back the same samples.
    """
    return np.clip(np.round(np.asarray(audio, dtype=np.float32) * 32768.0), -32768, 32767).astype(np.int16)


def to_float32(pcm: np.ndarray) -> np.ndarray:
    """Int16 samples as float32 in [-1, 1)."""
    return np.asarray(pcm, dtype=np.int16).astype(np.float32) / 32768.0


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    """Write mono audio (int16, or float in [-1, 1]) as a PCM16 WAV file."""
    pcm = audio if audio.dtype == np.int16 else to_pcm16(audio)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.astype("<i2", copy=False).tobytes())
