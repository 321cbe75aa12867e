"""Whisper over trimmed windows: as accurate as the full 30 s pass, guarded against loops, and batched."""

import numpy as np
import pytest

from voicepipe.audio import read_audio
from voicepipe.backends import whisper_trimmed
from voicepipe.backends.whisper_trimmed import compression_ratio, repeats
from voicepipe.bench.room_bench import word_errors

LOOP = "I have never failed," + " ever failed," * 12


def wer(pairs: list[tuple[str, str]]) -> float:
    errors, words = map(sum, zip(*(word_errors(r, h) for r, h in pairs), strict=True))
    return errors / words


@pytest.fixture(scope="module")
def clips(spoken_questions, asr) -> list[tuple[str, np.ndarray]]:
    return [(question, read_audio(path, asr.sample_rate)) for _, question, _, path in spoken_questions]


def test_word_error_rate_counts_edits():
    assert word_errors("What is the capital of Italy?", "what is the capitol of italy") == (1, 6)
    assert wer([("a b c d", "a b c d"), ("a b c d", "a x d")]) == 2 / 8


def test_the_set_covers_enough_questions_and_voices(spoken_questions):
    assert len({q for _, q, _, _ in spoken_questions}) >= 20
    assert len({v for v, _, _, _ in spoken_questions}) >= 3


def test_trimmed_path_is_as_accurate_as_the_full_pass(asr, spoken_questions, clips):
    voices = sorted({voice for voice, *_ in spoken_questions})
    questions = sorted({question for _, question, *_ in spoken_questions})
    # every question once, the voices taking turns: all of them heard at a quarter of the cost
    chosen = [clip for (voice, *_), clip in zip(spoken_questions, clips, strict=True)
              if voices.index(voice) == questions.index(clip[0]) % len(voices)]
    assert len(chosen) == len(questions)
    full = wer([(q, asr.full_pass(audio)) for q, audio in chosen])
    trimmed = wer([(q, asr.transcribe(audio)) for q, audio in chosen])
    assert trimmed <= full + 0.01, (trimmed, full)
    assert full < 0.35, full  # the set is heard at all: a broken set would make both figures meaningless


def test_the_window_is_padded_with_what_silence_is_to_whisper(asr, clips, monkeypatch):
    """Past the utterance the encoder's window holds what the mel of digital silence holds (Whisper pads the
    audio with zeros before the mel), not faster-whisper's zeros after it."""
    extractor = asr.model.feature_extractor
    audio = clips[0][1]
    windows, encode = [], asr.model.encode
    monkeypatch.setattr(asr.model, "encode", lambda features: windows.append(features) or encode(features))
    assert asr.trimmed.decode([audio])[0]
    followed = extractor(np.concatenate([audio, np.zeros(2 * extractor.sampling_rate, np.float32)]))
    assert windows[0].shape[2] > len(audio) // extractor.hop_length + 100
    assert np.allclose(windows[0][0, :, -100:], followed[:, -2:-1], atol=1e-4)


def test_the_guard_spots_loops():
    looping = [262, 1239, 11, 1683, 4054, 11, 1683, 4054, 11, 1683, 4054, 11, 1683, 4054, 11]
    assert repeats(looping)
    assert not repeats([2061, 318, 262, 3139, 286, 8031, 30])
    assert compression_ratio(LOOP) > whisper_trimmed.COMPRESSION_LIMIT
    assert compression_ratio("What is the capital of Italy?") < whisper_trimmed.COMPRESSION_LIMIT


def test_a_looping_transcript_falls_back_to_the_full_pass(asr, clips, monkeypatch):
    question, audio = clips[0]
    expected = asr.full_pass(audio)
    monkeypatch.setattr(asr.trimmed.tokenizer, "decode", lambda tokens: LOOP)
    assert asr.trimmed.decode([audio]) == [None]
    assert asr.transcribe(audio) == expected


def test_reaching_the_length_bound_falls_back(asr, clips, monkeypatch):
    _, audio = clips[1]
    monkeypatch.setattr(whisper_trimmed, "TOKENS_PER_S", 0)
    monkeypatch.setattr(whisper_trimmed, "TOKENS_BASE", 2)
    assert asr.trimmed.decode([audio]) == [None]
    full = []
    monkeypatch.setattr(asr, "full_pass", lambda a: full.append(a) or "full")
    assert asr.transcribe(audio) == "full" and len(full) == 1


def test_silence_and_no_audio_give_empty_transcripts(asr):
    silence = np.zeros(asr.sample_rate, np.float32)
    assert asr.transcribe(silence) == ""
    assert asr.transcribe(np.zeros(0, np.float32)) == ""
    assert asr.transcribe_batch([np.zeros(0, np.float32), silence]) == ["", ""]


def test_audio_longer_than_a_window_takes_the_full_pass(asr, clips, monkeypatch):
    _, audio = clips[0]
    long = np.concatenate([audio, np.zeros(31 * asr.sample_rate, np.float32)])
    assert not asr.trimmed.fits(long.size)
    calls = []
    monkeypatch.setattr(asr, "full_pass", lambda a: calls.append(a.size) or "full")
    assert asr.transcribe_batch([audio, long]) == [asr.transcribe(audio), "full"]
    assert calls == [long.size]


def test_a_batch_gives_each_utterance_its_own_transcript(asr, clips, monkeypatch):
    batch = [clips[i][1] for i in (0, 5, 10)]  # three different questions
    singles = [asr.transcribe(audio) for audio in batch]
    assert len(set(singles)) == 3
    encodes = []
    encode = asr.model.encode
    monkeypatch.setattr(asr.model, "encode", lambda features: encodes.append(features.shape) or encode(features))
    assert asr.transcribe_batch(batch) == singles
    assert len(encodes) == 1 and encodes[0][0] == 3
