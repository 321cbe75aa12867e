"""Turn-taking in the pipeline, over the fakes, from the endpointer's boundaries on: the LLM's verdict ending
a finished sentence at its pause and leaving a cut one open, manual turns that never answer by themselves,
replies left to the client, speech over the reply that does not stop it, and a cough too short to."""

import time

import numpy as np
import pytest
from support.fake_call import QUESTION, SECOND, Call

from voicepipe.audio import SAMPLE_RATE
from voicepipe.pipeline.detection import TurnDetection
from voicepipe.pipeline.end_of_turn import is_backchannel, judge_prompt, sentence_end_tokens, unpunctuated
from voicepipe.pipeline.events import AudioIn
from voicepipe.pipeline.requests import CommitRequested, ResponseRequested
from voicepipe.protocol import ServerEvent
from voicepipe.turns.endpointer import WINDOW, Boundary
from voicepipe.turns.vad_stage import VADStage


class ScriptedEndpointer:
    """An endpointer whose boundaries the test writes: each `feed` returns the next list of them."""

    def __init__(self, settings, script: list[list[Boundary]]) -> None:
        self.settings, self.script, self.max_utterance_s = settings, script, 30.0
        self.commits, self.speech_samples, self.limits, self.fed = 0, 0, [], 0

    def feed(self, samples: np.ndarray, unsuppressed: np.ndarray | None = None) -> list[Boundary]:
        """The next boundaries, as if the audio up to the last of them had just been fed."""
        found = self.script.pop(0) if self.script else []
        self.speech_samples = max([self.speech_samples, *(b.speech_samples for b in found)])
        self.fed = max([self.fed + len(samples), *(b.position for b in found)])
        return found

    def end_after(self, silence_ms: int) -> list[Boundary]:
        """As the real one, with the silence so far taken to be the first pause's 200 ms."""
        self.limits.append(silence_ms)
        return self.commit() if silence_ms <= 200 else []

    def commit(self) -> list[Boundary]:
        """The utterance ends with the speech heard by its last pause (no more came since)."""
        self.commits += 1
        return [Boundary("stop", 2 * SECOND, speech_samples=self.speech_samples)]

    def clear(self) -> bool:
        return False


def speech(windows: int, pause: bool = False) -> list[Boundary]:
    """Speech starting, `windows` windows of it, then (optionally) the first pause."""
    found = [Boundary("start", 0), *(Boundary("audio", WINDOW * (n + 1), np.zeros(WINDOW, np.float32), True)
                                     for n in range(windows))]
    silence = [Boundary("quiet", WINDOW * (windows + 3), speech_samples=WINDOW * windows),
               Boundary("pause", WINDOW * (windows + 6), speech_samples=WINDOW * windows)]
    return found + (silence if pause else [])


def scripted(call: Call, script: list[list[Boundary]]) -> ScriptedEndpointer:
    endpointer = ScriptedEndpointer(call.config.turn_detection, script)
    call.stage(VADStage).endpointer = endpointer
    return endpointer


async def feed(call: Call, times: int = 1) -> None:
    for _ in range(times):
        await call.push(AudioIn(np.zeros(WINDOW, np.float32)))


async def test_a_finished_sentence_ends_its_turn_at_the_first_pause():
    call = Call()
    endpointer = scripted(call, [speech(30, pause=True)])
    await feed(call)
    assert endpointer.commits == 1  # the LLM read "...France?" as finished: no waiting out a silence
    kinds = call.client.kinds()
    assert ServerEvent.SPEECH_STOPPED in kinds and kinds[-1] == ServerEvent.RESPONSE_DONE
    finals = [kind for kind, _ in call.engine.jobs if kind == "asr_final"]
    assert call.client.of(ServerEvent.RESPONSE_CREATED) and len(finals) == 1  # the pause's pass is the final one
    await call.close()


async def test_a_turn_is_timed_from_the_callers_last_voiced_frame():
    call = Call()
    scripted(call, [speech(30, pause=True)])  # the pause is heard 6 windows (192 ms) after the last speech
    before = time.monotonic()
    await feed(call)
    after = time.monotonic()
    silence_s = 6 * WINDOW / SAMPLE_RATE
    reply = call.speculative()
    spoke_until = reply.deadlines[0] - call.config.ttfa_s  # the deadline counts from the caller's last word
    assert before - silence_s <= spoke_until <= after - silence_s + 1e-6
    done = call.client.of(ServerEvent.RESPONSE_DONE)[0]["response"]
    assert done["timings"]["pause_s"] == pytest.approx(silence_s, abs=0.05)  # the pause took its 192 ms
    assert done["timings"]["first_audio_s"] >= silence_s
    assert sum(done["waterfall"].values()) == pytest.approx(done["timings"]["first_audio_s"], abs=1e-3)
    await call.close()


async def test_the_engine_expects_the_caller_from_their_first_silence_until_the_first_audio():
    call = Call()
    scripted(call, [speech(30, pause=True)])
    await feed(call)
    hints = call.engine.expected
    assert [until is None for _, until in hints] == [False, True]  # told at the silence, then released
    assert hints[0][1] == pytest.approx(call.speculative().deadlines[0])  # until the turn's deadline
    await call.close()


async def test_the_engine_stops_expecting_a_caller_who_speaks_on():
    call = Call()
    call.asr.text = "What is the capital of"
    scripted(call, [speech(30, pause=True), [Boundary("audio", 40 * WINDOW, np.ones(WINDOW, np.float32), True)]])
    await feed(call, 2)
    assert call.engine.expected[-1] == ("call", None)  # speech came back: no turn is ending
    await call.close()


async def test_a_sentence_cut_at_a_word_waits_for_the_rest_and_becomes_one_turn():
    call = Call()
    call.asr.text = "What is the capital of"
    endpointer = scripted(call, [speech(30, pause=True), [Boundary("audio", SECOND, np.ones(SECOND, np.float32), True)],
                                 [Boundary("pause", 2 * SECOND, speech_samples=2 * SECOND)]])
    await feed(call)
    assert endpointer.commits == 0 and ServerEvent.SPEECH_STOPPED not in call.client.kinds()
    assert endpointer.limits[0] >= 1000  # "...capital of" waits over a second for the rest
    assert ServerEvent.RESPONSE_CREATED not in call.client.kinds()  # nothing is said over an unfinished sentence
    call.asr.text = QUESTION
    await feed(call, 2)  # the caller goes on ("... France?") and pauses again
    assert endpointer.commits == 1
    assert [m["transcript"] for m in call.client.of(ServerEvent.TRANSCRIPT_COMPLETED)] == [QUESTION]
    assert len(call.client.of(ServerEvent.RESPONSE_CREATED)) == 1
    assert [i["role"] for i in call.conversation.items] == ["user", "assistant"]
    await call.close()


async def test_under_server_vad_the_pause_does_not_end_the_turn():
    call = Call()
    call.config.turn_detection.type = "server_vad"
    endpointer = scripted(call, [speech(30, pause=True)])
    await feed(call)
    assert endpointer.commits == 0  # only the silence ends it
    assert not [r for r in call.engine.requests if r.params.probe_tokens]  # and no judge runs
    await call.close()


async def test_under_manual_turns_the_server_never_answers_by_itself():
    call = Call()
    call.config.turn_detection.type = None
    endpointer = scripted(call, [speech(30)])
    await feed(call)
    await call.push(CommitRequested())
    assert endpointer.commits == 1
    kinds = call.client.kinds()
    assert ServerEvent.SPEECH_STARTED not in kinds  # no detection: the client's buffer is the utterance
    assert ServerEvent.TRANSCRIPT_COMPLETED in kinds and ServerEvent.RESPONSE_CREATED not in kinds
    assert call.conversation.items[0]["content"] == QUESTION
    await call.push(ResponseRequested())
    assert call.client.kinds()[-1] == ServerEvent.RESPONSE_DONE
    await call.close()


async def test_without_create_response_a_finished_turn_waits_for_the_client():
    call = Call()
    call.config.turn_detection.create_response = False
    scripted(call, [speech(30, pause=True)])
    await feed(call)
    kinds = call.client.kinds()
    assert ServerEvent.TRANSCRIPT_COMPLETED in kinds and ServerEvent.RESPONSE_CREATED not in kinds
    await call.close()


async def reply_then_speech(call: Call, windows: int) -> None:
    """A finished reply whose audio is still playing, then `windows` windows of the caller's speech."""
    scripted(call, [speech(30, pause=True), speech(windows)])
    await feed(call)
    assert call.client.of(ServerEvent.RESPONSE_DONE)[0]["response"]["status"] == "completed"
    call.client.messages.clear()
    await feed(call)


async def test_a_cough_shorter_than_a_barge_in_does_not_stop_the_reply():
    call = Call(reply=" ".join(f"Sentence number {n} is here." for n in range(8)))
    await reply_then_speech(call, 3)
    assert call.client.kinds() == [ServerEvent.SPEECH_STARTED]  # heard, but the reply plays on
    await call.close()


@pytest.mark.parametrize("windows", [3, 8])
async def test_the_end_of_an_utterance_says_how_much_of_it_was_speech(windows):
    """Turn-taking tells the echo's residue, a few windows of speech as a reply begins, from the caller."""
    from support.fake_call import run_stage

    from voicepipe.pipeline.events import BargeIn, SpeechStopped
    from voicepipe.turns.endpointer import WINDOW_MS

    said = speech(windows) + [Boundary("audio", WINDOW * (windows + 1), np.zeros(WINDOW, np.float32), False),
                              Boundary("stop", WINDOW * (windows + 20), speech_samples=WINDOW * windows)]
    stage = VADStage(ScriptedEndpointer(TurnDetection("server_vad"), [said]))
    down, _ = await run_stage(stage, [AudioIn(np.zeros(WINDOW, np.float32))])
    stopped = [e for e in down if isinstance(e, SpeechStopped)]
    assert [e.voiced_ms for e in stopped] == [windows * WINDOW_MS]
    assert any(isinstance(e, BargeIn) for e in down) is (windows >= 4)


@pytest.mark.parametrize("interrupt", [True, False])
async def test_speech_over_the_reply_stops_its_audio_only_if_interruptions_are_on(interrupt):
    call = Call(reply=" ".join(f"Sentence number {n} is here." for n in range(8)))
    call.config.turn_detection.interrupt_response = interrupt
    await reply_then_speech(call, 8)
    assert (ServerEvent.PLAYBACK_CLEARED in call.client.kinds()) is interrupt
    await call.close()


def test_backchannels_and_noises_are_told_from_words():
    for text in ("Mm-hmm.", "Yeah.", "uh huh", "Uh-uh.", "Okay, okay.", "(coughs)", "", "[BLANK_AUDIO]", "Hmm, right.",
                 "Thank you.", "Thanks.", "Okay, thank you."):
        assert is_backchannel(text), text
    for text in ("Stop.", "Wait, what?", "Tell me about Spain.", "Yeah, but why?", "No", "Thank you, stop."):
        assert not is_backchannel(text), text


def test_the_judged_prompt_ends_where_the_callers_message_would_close():
    assert judge_prompt([1, 5, 2, 7, 8, 9, 2, 3, 4], 2) == [1, 5, 2, 7, 8, 9]
    assert judge_prompt([1, 5, 7], 2) is None


def test_the_less_finished_the_words_the_longer_the_silence_waited():
    detection = TurnDetection()
    waits = [detection.silence_ms(p, 200) for p in (0.5, 0.05, 0.03, 0.01, 0.003, 1e-9)]
    assert waits[0] == waits[1] == 200 and waits[1] < waits[2] < waits[3] < waits[4]
    assert waits[4] == waits[5] == detection.max_silence_ms


def test_the_turn_end_is_timed_from_the_pause_when_semantic():
    assert TurnDetection().end_after_pause_s(200) == 0.0
    assert TurnDetection(type="server_vad", silence_duration_ms=500).end_after_pause_s(200) == pytest.approx(0.3)
    assert TurnDetection(eagerness="low").max_silence_ms > TurnDetection(eagerness="high").max_silence_ms


def test_the_judge_reads_final_punctuation_and_the_end_token_as_a_finished_sentence():
    class Vocab:
        eos_token_id = 1

        def get_vocab(self) -> dict[str, int]:
            return {"Ġ?": 5, "?": 6, '."': 7, "a.": 8, "Ġthe": 9, "...": 10, ",": 11}

    assert sentence_end_tokens(Vocab()) == (1, 5, 6, 7, 10)
    assert unpunctuated("What is the capital of?") == "What is the capital of"
    assert unpunctuated(" Name a fruit that is... ") == "Name a fruit that is"
