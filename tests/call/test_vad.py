"""The streaming VAD and endpointer on espeak-ng speech surrounded by silence."""

import numpy as np
import pytest

from voicepipe.audio import SAMPLE_RATE, read_audio
from voicepipe.pipeline.detection import TurnDetection
from voicepipe.turns.endpointer import Endpointer

FRAME = SAMPLE_RATE // 50  # 20 ms, as clients send it


@pytest.fixture(scope="module")
def speech(speech_wav) -> np.ndarray:
    return read_audio(speech_wav("The quick brown fox jumps over the lazy dog."), SAMPLE_RATE)


def loud_extent(audio: np.ndarray) -> tuple[float, float]:
    """First and last loud sample, in seconds: where the speech really is."""
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return loud[0] / SAMPLE_RATE, loud[-1] / SAMPLE_RATE


def stream(endpointer: Endpointer, audio: np.ndarray) -> list:
    found = []
    for start in range(0, len(audio), FRAME):
        found += endpointer.feed(audio[start:start + FRAME])
    return found


def test_finds_start_and_end_of_speech(speech):
    silence = np.zeros(SAMPLE_RATE, np.float32)
    audio = np.concatenate([silence, speech, silence, silence])
    onset, offset = loud_extent(audio)
    found = stream(Endpointer(TurnDetection(type="server_vad")), audio)
    kinds = [b.kind for b in found if b.kind not in ("audio", "quiet")]
    assert kinds == ["start", "pause", "stop"], kinds
    start, stop = found[0], next(b for b in found if b.kind == "stop")
    # The utterance begins up to the 300 ms prefix padding (plus a window or two) before the speech...
    assert onset - 0.3 - 0.1 <= start.position / SAMPLE_RATE <= onset + 0.1
    # ...and ends after 500 ms of silence following its last word.
    assert offset + 0.4 <= stop.position / SAMPLE_RATE <= offset + 0.5 + 0.3
    assert not stop.truncated
    utterance = sum(len(b.audio) for b in found if b.kind == "audio")
    assert utterance == stop.position - start.position
    assert stop.speech_samples <= utterance


def test_silence_is_not_speech():
    assert stream(Endpointer(), np.zeros(3 * SAMPLE_RATE, np.float32)) == []


def test_long_speech_is_cut(speech):
    found = stream(Endpointer(max_utterance_s=1.0), np.concatenate([speech, np.zeros(SAMPLE_RATE, np.float32)]))
    stops = [b for b in found if b.kind == "stop"]
    assert len(stops) == 1 and stops[0].truncated
    assert sum(len(b.audio) for b in found if b.kind == "audio") <= SAMPLE_RATE


@pytest.mark.parametrize("silence_ms", [200, 900])
def test_a_verdict_at_the_pause_ends_the_utterance_after_the_silence_it_asks_for(speech, silence_ms):
    audio = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), speech, np.zeros(3 * SAMPLE_RATE, np.float32)])
    _, offset = loud_extent(audio)
    endpointer = Endpointer(TurnDetection())  # semantic: on its own it would wait 2 s
    found, pause = [], None
    for start in range(0, len(audio), FRAME):
        found += endpointer.feed(audio[start:start + FRAME])
        if pause is None and any(b.kind == "pause" for b in found):
            pause = next(b for b in found if b.kind == "pause")
            found += endpointer.end_after(silence_ms)
    stop = next(b for b in found if b.kind == "stop")
    if silence_ms <= 200:
        assert stop.position == pause.position  # the pause had lasted that long already: ended at once
    assert offset + silence_ms / 1000 - 0.1 <= stop.position / SAMPLE_RATE <= offset + silence_ms / 1000 + 0.2


def test_under_manual_turns_all_audio_is_the_utterance_until_commit(speech):
    audio = np.concatenate([np.zeros(SAMPLE_RATE, np.float32), speech, np.zeros(3 * SAMPLE_RATE, np.float32)])
    endpointer = Endpointer(TurnDetection(type=None))
    found = stream(endpointer, audio)
    assert [b.kind for b in found if b.kind != "audio"] == ["start"] and found[0].position == 0
    assert sum(len(b.audio) for b in found if b.kind == "audio") == len(audio) // 512 * 512  # silence too
    stop = endpointer.commit()
    assert [b.kind for b in stop] == ["stop"] and endpointer.commit() == []


class Scores:
    """A stand-in for the VAD's model: the scores given, one per window."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = iter(scores)

    def __call__(self, window: np.ndarray) -> float:
        return next(self.scores)


def windows(levels: list[float]) -> np.ndarray:
    """Audio whose windows have the given RMS levels, one per window."""
    from voicepipe.turns.endpointer import WINDOW

    rng = np.random.default_rng(0)
    return np.concatenate([rng.standard_normal(WINDOW).astype(np.float32) * np.float32(v) for v in levels])


def test_the_threshold_follows_a_steady_noise_floor_so_noise_neither_starts_nor_holds_a_turn():
    noisy = [0.45] * 200 + [0.6] * 10 + [0.95] * 20 + [0.55] * 40
    endpointer = Endpointer(TurnDetection(type="server_vad"), vad=Scores(noisy))
    found = endpointer.feed(windows([0.01] * 210 + [0.05] * 20 + [0.01] * 40))
    assert endpointer.threshold > 0.75  # 0.45 of noise, and the margin over it
    kinds = [b.kind for b in found if b.kind != "audio"]
    assert kinds[0] == "start" and kinds[-1] == "stop"  # the speech, not the 0.6 of noise, started it; the
    assert found[0].position >= 210 * 512 - 320 * 16  # noise after it did not hold the turn open
    quiet = Endpointer(TurnDetection(type="server_vad"), vad=Scores([0.02] * 100 + [0.6] * 5))
    assert [b.kind for b in quiet.feed(windows([0.0] * 100 + [0.05] * 5))][:1] == ["start"]  # quiet: 0.5 holds


class Loudness:
    """A VAD that hears speech in any window over 0.02 RMS."""

    def __call__(self, window: np.ndarray) -> float:
        return 0.95 if np.sqrt(np.mean(np.square(window))) > 0.02 else 0.05


def test_the_vad_judges_the_audio_before_the_suppressor_and_the_utterance_is_the_suppressed_audio():
    before = windows([0.001] * 40 + [0.05] * 20 + [0.001] * 40)
    after = before * np.float32(0.1)  # the voice 20 dB down: a suppressor's output, under the VAD's ear
    found = Endpointer(TurnDetection(type="server_vad"), vad=Loudness()).feed(after, before)
    assert [b.kind for b in found if b.kind in ("start", "stop")] == ["start", "stop"]
    start = found[0].position
    heard = np.concatenate([b.audio for b in found if b.kind == "audio"])
    assert np.array_equal(heard, after[start:start + len(heard)])  # the utterance: what the ASR is to hear
    alone = Endpointer(TurnDetection(type="server_vad"), vad=Loudness()).feed(after)
    assert not [b for b in alone if b.kind == "start"]  # judged on the suppressed audio, the voice is missed


def test_voices_around_the_caller_at_the_noises_level_are_no_speech_and_the_caller_above_them_is():
    """Babble scores as speech; what sets the caller apart is standing above it. (Before half a second of
    audio gives the level floor, the VAD alone decides: babble there may start an utterance, which ends
    once the floor is known.)"""
    babble = Endpointer(TurnDetection(type="server_vad"), vad=Scores([0.3, 0.9] * 100 + [0.95] * 20 + [0.9] * 40))
    found = babble.feed(windows([0.01] * 200 + [0.04] * 20 + [0.01] * 40))
    starts = [b.position for b in found if b.kind == "start"]
    stops = [b.position for b in found if b.kind == "stop"]
    assert len(starts) == len(stops) and stops[-1] > starts[-1] >= 200 * 512 - 320 * 16  # the caller, 12 dB over
    assert all(stop < 60 * 512 for stop in stops[:-1])  # babble held no turn open past the first seconds
