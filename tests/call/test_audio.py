"""Reading any WAV to float32 mono at the rate asked for, and rejecting what is not audio."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from voicepipe.audio import AudioError, read_audio, to_float32, to_pcm16, write_wav

SAMPLE = Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav"


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return read_audio(SAMPLE, 16000)


@pytest.mark.parametrize("sox_format", [
    ["-b", "8", "-e", "unsigned-integer"],
    ["-b", "24", "-e", "signed-integer"],
    ["-b", "32", "-e", "signed-integer"],
    ["-b", "32", "-e", "floating-point"],
    ["-b", "64", "-e", "floating-point"],
    ["-b", "16", "-c", "2"],
])
def test_sample_formats_read_alike(tmp_path, reference, sox_format):
    converted = tmp_path / "converted.wav"
    subprocess.run(["sox", str(SAMPLE), *sox_format, str(converted)], check=True, capture_output=True)
    audio = read_audio(converted, 16000)
    assert audio.dtype == np.float32 and audio.shape == reference.shape
    assert np.abs(audio - reference).max() < 0.02  # 8-bit quantization is the coarsest


def test_resampling_keeps_duration(tmp_path, reference):
    resampled = tmp_path / "44k.wav"
    subprocess.run(["sox", str(SAMPLE), "-r", "44100", str(resampled)], check=True, capture_output=True)
    assert abs(len(read_audio(resampled, 16000)) - len(reference)) <= 2
    assert abs(len(read_audio(SAMPLE, 22050)) - len(reference) * 22050 / 16000) <= 2


def test_write_then_read_round_trip(tmp_path, reference):
    path = tmp_path / "out.wav"
    write_wav(path, reference, 16000)
    assert np.abs(read_audio(path, 16000) - reference).max() < 1e-4
    pcm = to_pcm16(reference)
    assert np.array_equal(to_pcm16(to_float32(pcm)), pcm)


def test_pcm16_conversion_clips_instead_of_wrapping():
    assert to_pcm16(np.array([2.0, -2.0, 0.5], dtype=np.float32)).tolist() == [32767, -32768, 16384]


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    (b"", "is empty"),
    (b"hello, not audio\n", "not a readable audio file"),
    (b"RIFF\x04\x00\x00\x00WAVE", "not a readable audio file"),
])
def test_bad_files_raise_one_line_audio_errors(tmp_path, content, message):
    path = tmp_path / "bad.wav"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(AudioError, match=message) as caught:
        read_audio(path, 16000)
    assert "\n" not in str(caught.value)


def test_a_wav_without_samples_is_rejected(tmp_path):
    path = tmp_path / "silent.wav"
    write_wav(path, np.zeros(0, dtype=np.int16), 16000)
    with pytest.raises(AudioError, match="no audio samples"):
        read_audio(path, 16000)
