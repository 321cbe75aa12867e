"""The TurnTaking stage on its own: the verdicts it gives the LLM stage for the caller's speech, pauses and
words, over the fake engine."""

import time

from support.fake_call import run_stage
from support.fakes import FakeEngine, FakeTokenizer

from voicepipe.pipeline import CallConfig, Conversation
from voicepipe.pipeline.detection import TurnDetection
from voicepipe.pipeline.events import (
    BargeInResolved,
    PlaybackPaused,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    UtteranceDropped,
)
from voicepipe.pipeline.turn import Turn
from voicepipe.pipeline.verdicts import DropSpeculation, Speculate, TurnEnded
from voicepipe.turns.turn_taking import TurnTaking


def stage(**config) -> TurnTaking:
    engine = FakeEngine(FakeTokenizer())
    call = CallConfig(**config)
    return TurnTaking(engine, engine.tokenizer, Conversation("", engine.tokenizer), call, "call")


def verdicts(events: list) -> list:
    return [e for e in events if isinstance(e, TurnEnded | Speculate | DropSpeculation | BargeInResolved)]


def final(item: str, text: str) -> TranscriptFinal:
    return TranscriptFinal(item, text, time.monotonic(), 0.1)


async def test_a_finished_utterance_is_answered_unless_the_caller_already_speaks_again():
    now = time.monotonic()
    down, _ = await run_stage(stage(), [SpeechStarted("item_1", 0, now), SpeechStopped("item_1", 900, now, 100),
                                        final("item_1", "What time is it?")])
    assert [(type(v).__name__, getattr(v, "answer", None)) for v in verdicts(down)] == \
        [("DropSpeculation", None), ("TurnEnded", True)]
    said = final("item_1", "What time is it?")
    down, _ = await run_stage(stage(), [SpeechStarted("item_1", 0, now), said])
    assert verdicts(down)[-1] == TurnEnded(said, answer=False)  # still speaking: it joins, no reply yet


async def test_a_pause_begins_the_reply_ahead_and_the_caller_speaking_on_drops_it():
    now = time.monotonic()
    early = TranscriptEarly("item_1", "What time is it", now, now - 0.2)
    down, _ = await run_stage(stage(), [early, SpeechStarted("item_1", 0, now)])
    assert verdicts(down) == [Speculate(early), DropSpeculation()]
    down, _ = await run_stage(stage(speculative=False, turn_detection=TurnDetection("server_vad")), [early])
    assert verdicts(down) == []  # no reply ahead asked for, and no judge under server VAD


async def test_a_backchannel_over_a_reply_lets_it_play_on_and_words_cancel_it():
    now, turn = time.monotonic(), Turn("resp_1", "call-resp_1", "item_0", 0.0, 1.5)
    paused = PlaybackPaused("item_2", turn, now)
    down, up = await run_stage(stage(), [paused, TranscriptEarly("item_2", "mm-hm", now, now),
                                         final("item_2", "mm-hm")])
    assert verdicts(down) == [BargeInResolved("item_2", real=False, turn=turn)]  # no reply of its own either
    assert up == [paused]  # the pause goes on up, to the stages before
    words = final("item_2", "Wait, tell me about Spain instead.")
    down, _ = await run_stage(stage(), [paused, words])
    assert verdicts(down) == [BargeInResolved("item_2", real=True, turn=turn), TurnEnded(words, answer=True)]


async def test_words_that_repeat_what_the_assistant_just_said_are_its_echo_never_answered():
    import numpy as np

    from voicepipe.pipeline.events import EchoPathJudged, Playout

    now, turn = time.monotonic(), Turn("resp_1", "call-resp_1", "item_0", 0.0, 1.5)
    said = Playout(np.zeros(16000, np.int16), 16000, now - 0.5, "There are no direct flights to Rome today.")
    paused = PlaybackPaused("item_2", turn, now)
    taking = stage()
    down, up = await run_stage(taking, [EchoPathJudged(True), said, paused, SpeechStarted("item_2", 0, now),
                                        SpeechStopped("item_2", 900, now, 100), final("item_2", "There are no")])
    assert said in up  # passed on to the audio front end
    assert verdicts(down)[-1] == BargeInResolved("item_2", real=False, turn=turn)  # the reply resumes
    assert not any(isinstance(v, TurnEnded) for v in verdicts(down)) and taking.echoes == 1
    # Told as its item dropped, in place of the caller's transcript
    assert UtteranceDropped("item_2", "There are no", "own_voice") in down
    assert not any(isinstance(e, TranscriptFinal) for e in down)
    down, _ = await run_stage(taking, [SpeechStarted("item_3", 0, now), SpeechStopped("item_3", 900, now, 100),
                                       final("item_3", "What about trains to Rome?")])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # the caller's own words are answered
    down, _ = await run_stage(stage(), [SpeechStarted("item_4", 0, now), SpeechStopped("item_4", 900, now, 100),
                                        final("item_4", "There are no")])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # nothing was said: not an echo


def test_a_question_about_the_reply_brings_words_of_its_own_and_is_no_echo():
    from voicepipe.turns.own_voice import OwnVoice

    own = OwnVoice()
    own.heard = True
    own.played("Paris is the capital of France.", time.monotonic() - 1.0, time.monotonic())
    assert not own.is_echo("What is the capital of France?", time.monotonic())
    assert own.is_echo("the capital of France", time.monotonic())


async def test_the_callers_repeat_of_the_reply_is_answered_once_it_ended_or_unless_the_loudspeaker_is_heard():
    import numpy as np

    from voicepipe.pipeline.events import EchoPathJudged, Playout
    from voicepipe.turns.own_voice import TAIL_S

    now = time.monotonic()
    said = Playout(np.zeros(16000, np.int16), 16000, now - 1.0, "The capital of France is Paris.")

    def repeat(item: str, began: float) -> list:
        return [SpeechStarted(item, 0, began), SpeechStopped(item, 900, began + 1, 100), final(item, "Paris")]

    heard = EchoPathJudged(True)
    down, _ = await run_stage(stage(), [heard, said, *repeat("item_1", now - 0.5)])
    assert not any(isinstance(v, TurnEnded) for v in verdicts(down))  # begun as it played: its echo
    down, _ = await run_stage(stage(), [heard, said, *repeat("item_1", now + TAIL_S + 0.1)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # begun after it ended: the caller's
    down, _ = await run_stage(stage(), [said, EchoPathJudged(False), *repeat("item_1", now - 0.5)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # the microphone does not hear the loudspeaker
    down, _ = await run_stage(stage(), [said, *repeat("item_1", now - 0.5)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # not yet known: the canceller alone


async def test_a_sound_begun_over_the_reply_too_short_to_barge_in_is_never_answered():
    """The echo's residue as a reply begins, heard by the VAD for a window or three, reaches the ASR as
    "Thanks." or "I will."; a caller's own words over the reply are speech for far longer."""
    import numpy as np

    from voicepipe.pipeline.events import EchoPathJudged, Playout
    from voicepipe.turns.vad_stage import BARGE_IN_MS

    now = time.monotonic()
    said = Playout(np.zeros(32000, np.int16), 16000, now - 0.5, "The capital of France is Paris.")

    def utterance(item: str, voiced_ms: int) -> list:
        return [SpeechStarted(item, 0, now), SpeechStopped(item, 900, now + 1, 100, voiced_ms=voiced_ms),
                final(item, "Thanks.")]

    taking = stage()
    down, _ = await run_stage(taking, [EchoPathJudged(True), said, *utterance("item_1", BARGE_IN_MS - 32)])
    assert not any(isinstance(v, TurnEnded) for v in verdicts(down)) and taking.echoes == 1
    assert [e for e in down if isinstance(e, TranscriptFinal | UtteranceDropped)] == \
        [UtteranceDropped("item_1", "Thanks.", "sound")]
    down, _ = await run_stage(stage(), [EchoPathJudged(True), said, *utterance("item_1", BARGE_IN_MS)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # long enough to be the caller's
    down, _ = await run_stage(stage(), [EchoPathJudged(False), said, *utterance("item_1", BARGE_IN_MS - 32)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # the loudspeaker is not heard
    down, _ = await run_stage(stage(), [EchoPathJudged(True), *utterance("item_1", BARGE_IN_MS - 32)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # nothing was playing
    manual = stage(turn_detection=TurnDetection(None))
    down, _ = await run_stage(manual, [EchoPathJudged(True), said, *utterance("item_1", BARGE_IN_MS - 32)])
    assert any(isinstance(v, TurnEnded) for v in verdicts(down))  # committed by the client: its own to judge


async def test_a_sound_over_the_reply_begins_no_reply_ahead_at_its_pause():
    """Judged at the pause as at the end: its early transcript neither begins a reply ahead (which would take
    the place of the reply being written) nor waits on the judge."""
    import numpy as np

    from voicepipe.pipeline.events import EchoPathJudged, Playout, SpeechPaused
    from voicepipe.turns.vad_stage import BARGE_IN_MS

    now = time.monotonic()
    said = Playout(np.zeros(32000, np.int16), 16000, now - 0.5, "The capital of France is Paris.")
    early = TranscriptEarly("item_1", "Thanks", now, now)

    def paused(voiced_ms: int) -> list:
        return [EchoPathJudged(True), said, SpeechStarted("item_1", 0, now),
                SpeechPaused("item_1", 1600, now + 0.3, now + 0.1, voiced_ms), early]

    down, _ = await run_stage(stage(), paused(BARGE_IN_MS - 64))
    assert Speculate(early) not in verdicts(down)
    down, _ = await run_stage(stage(), paused(BARGE_IN_MS + 64))
    assert Speculate(early) in verdicts(down)  # the caller's words, begun over the reply
