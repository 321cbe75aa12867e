"""Whisper over trimmed windows: as accurate as the full 30 s pass, guarded against loops, and batched."""

import asyncio
import re
from types import SimpleNamespace

import numpy as np
import pytest
from voicepipe.pipeline.asr_batch import ASRBatcher

from voicepipe.audio import read_audio
from voicepipe.backends import whisper_trimmed
from voicepipe.backends.whisper_trimmed import compression_ratio, repeats

LOOP = "I have never failed," + " ever failed," * 12


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(word edit distance, reference words), ignoring case and punctuation."""
    ref, hyp = (re.findall(r"[a-z0-9']+", t.lower()) for t in (reference, heard))
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1], len(ref)


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


class FakeEngine:
    """Queues jobs until `release`, as a busy engine would, and counts them."""

    def __init__(self) -> None:
        self.jobs: list[str] = []
        self.gate = asyncio.Event()

    async def run_job(self, fn, cls, deadline, kind):
        self.jobs.append(kind)
        await self.gate.wait()
        return fn()


class EchoASR:
    """Transcribes audio as its length; records the batches it was given."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.batches: list[int] = []

    def transcribe(self, audio: np.ndarray) -> str:
        self.batches.append(1)
        return str(audio.size)


class EchoBatchASR(EchoASR):
    def transcribe_batch(self, batch: list[np.ndarray]) -> list[str]:
        self.batches.append(len(batch))
        return [str(audio.size) for audio in batch]


async def test_concurrent_final_passes_share_one_job():
    engine, asr = FakeEngine(), EchoBatchASR()
    batcher = ASRBatcher(engine, asr)
    tasks = [asyncio.create_task(batcher.transcribe(np.zeros(n, np.float32), None)) for n in (10, 20, 30)]
    await asyncio.sleep(0)
    engine.gate.set()
    assert await asyncio.gather(*tasks) == ["10", "20", "30"]
    assert engine.jobs == ["asr_final"] and asr.batches == [3]
    assert await batcher.transcribe(np.zeros(40, np.float32), None) == "40"  # the first job has run: a new one
    assert len(engine.jobs) == 2


async def test_a_cancelled_caller_is_left_out_of_the_batch():
    engine, asr = FakeEngine(), EchoBatchASR()
    batcher = ASRBatcher(engine, asr)
    kept = asyncio.create_task(batcher.transcribe(np.zeros(10, np.float32), None))
    dropped = asyncio.create_task(batcher.transcribe(np.zeros(20, np.float32), None))
    await asyncio.sleep(0)
    dropped.cancel()
    await asyncio.sleep(0)
    engine.gate.set()
    assert await kept == "10" and dropped.cancelled()
    assert asr.batches == [1]


async def test_a_backend_without_batches_is_called_per_utterance():
    engine, asr = FakeEngine(), EchoASR()
    batcher = ASRBatcher(engine, asr)
    tasks = [asyncio.create_task(batcher.transcribe(np.zeros(n, np.float32), None)) for n in (5, 7)]
    await asyncio.sleep(0)
    engine.gate.set()
    assert await asyncio.gather(*tasks) == ["5", "7"]
    assert len(engine.jobs) == 1 and asr.batches == [1, 1]


def test_the_runtime_shares_one_batcher_with_every_call():
    from fakes import FakeEngine as ScriptedEngine
    from fakes import FakeTokenizer

    from voicepipe.pipeline import CallConfig, Conversation, build_pipeline
    from voicepipe.pipeline.asr_stage import ASRStage
    from voicepipe.runtime import Runtime

    runtime = Runtime(ScriptedEngine(FakeTokenizer()), None, EchoBatchASR(), SimpleNamespace(sample_rate=22050))
    stages = [build_pipeline(runtime, f"call-{n}", CallConfig(), Conversation(""), lambda event: None).stages
              for n in range(2)]
    finals = {id(s.finals) for call in stages for s in call if isinstance(s, ASRStage)}
    assert finals == {id(runtime.asr_finals)}
