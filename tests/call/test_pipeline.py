"""The pipeline's own logic against fake models and a fake engine, in milliseconds: a turn end to end,
the early final pass, speculative replies kept and dropped, the first-clause rule, pacing, agreement,
barge-in and truncation. Utterance events go in directly, as the VAD stage would emit them."""

import asyncio
import time

import numpy as np
import pytest
from support.fake_call import QUESTION, REPLY, SECOND, Call, run_stage

from scheduler import RequestClass
from voicepipe.pipeline.agreement import Agreement
from voicepipe.pipeline.events import (
    BargeIn,
    InputCleared,
    Paced,
    Played,
    ResponseCreated,
    Sentence,
    SpeechAudio,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TurnCancelled,
)
from voicepipe.pipeline.llm_stage import LLMStage
from voicepipe.pipeline.output import ClientOutput
from voicepipe.pipeline.pacing import Pacing, PlaybackClock
from voicepipe.pipeline.requests import ItemCreated, ItemRequested, ResponseRequested, TruncateRequested
from voicepipe.pipeline.sentences import SentenceAggregator
from voicepipe.pipeline.tts_stage import TTSStage
from voicepipe.pipeline.turn import Mark, Reply, Turn, waterfall
from voicepipe.protocol import ServerEvent


async def test_a_finished_utterance_is_transcribed_answered_and_spoken():
    call = Call()
    await call.utterance()
    kinds = call.client.kinds()
    assert kinds[:3] == [ServerEvent.SPEECH_STARTED, ServerEvent.SPEECH_STOPPED, ServerEvent.AUDIO_COMMITTED]
    assert kinds[-2:] == [ServerEvent.RESPONSE_AUDIO_DONE, ServerEvent.RESPONSE_DONE]
    assert kinds.index(ServerEvent.TRANSCRIPT_COMPLETED) < kinds.index(ServerEvent.RESPONSE_CREATED)
    usage = call.client.of(ServerEvent.TRANSCRIPT_COMPLETED)[0]["usage"]
    assert usage == {"type": "duration", "seconds": 1.0}  # the second of audio the utterance held
    text = "".join(m["delta"] for m in call.client.of(ServerEvent.RESPONSE_TEXT_DELTA))
    assert text == REPLY
    frames = [m for m in call.client.messages if isinstance(m, bytes)]
    assert len(frames) == 2  # one per sentence
    done = call.client.of(ServerEvent.RESPONSE_DONE)[0]["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == len(REPLY.split())
    assert [(i["role"], i["content"]) for i in call.conversation.items] == [("user", QUESTION), ("assistant", REPLY)]
    realtime = [r for r in call.engine.requests if r.cls is RequestClass.REALTIME]
    assert len(realtime) == 1 and realtime[0].session == "call" and realtime[0].closed
    await call.close()

async def test_the_pass_at_the_pause_is_the_final_one_when_nothing_more_was_said():
    call = Call(speculative=False)
    await call.utterance(pause=True)
    assert call.asr.passes == 1  # the early pass covered all the speech: no second pass at the end
    assert call.client.of(ServerEvent.TRANSCRIPT_COMPLETED)[0]["transcript"] == QUESTION
    await call.close()


async def test_a_speculative_reply_is_held_until_the_end_of_speech_is_confirmed():
    call = Call()
    await call.utterance(pause=True, stop=False)
    speculative = call.speculative()
    assert speculative.tokens > 0  # the reply is being written (as a REALTIME request: it also decides the turn)
    assert ServerEvent.RESPONSE_CREATED not in call.client.kinds()  # but the caller hears nothing of it
    assert call.conversation.items == []
    await call.push(SpeechStopped("item_1", 1000, time.monotonic(), SECOND))
    kinds = call.client.kinds()
    assert kinds.count(ServerEvent.RESPONSE_CREATED) == 1 and kinds[-1] == ServerEvent.RESPONSE_DONE
    assert kinds.index(ServerEvent.TRANSCRIPT_COMPLETED) < kinds.index(ServerEvent.RESPONSE_CREATED)
    assert call.engine.promoted == [(speculative.request_id, RequestClass.REALTIME)]
    assert len([r for r in call.engine.requests if r.params.max_tokens > 1]) == 1  # no second request
    assert [(i["role"], i["content"]) for i in call.conversation.items] == [("user", QUESTION), ("assistant", REPLY)]
    await call.close()

async def test_a_speculative_reply_is_dropped_unheard_when_the_caller_goes_on():
    call = Call()
    call.engine.gate.clear()  # the speculative reply is still being written when the caller speaks again
    await call.utterance(pause=True, stop=False)
    speculative = call.speculative()
    await call.push(SpeechResumed("item_1"))
    assert speculative.closed and call.client.kinds().count(ServerEvent.RESPONSE_CREATED) == 0
    call.engine.gate.set()
    await call.push(SpeechAudio("item_1", np.zeros(SECOND, np.float32), False),
                    SpeechStopped("item_1", 2000, time.monotonic(), 2 * SECOND))
    assert call.client.kinds().count(ServerEvent.RESPONSE_CREATED) == 1
    created = call.client.of(ServerEvent.RESPONSE_CREATED)[0]["response"]["id"]
    assert created not in speculative.request_id
    assert [i["role"] for i in call.conversation.items] == ["user", "assistant"]
    await call.close()

async def test_the_first_piece_of_a_reply_ends_at_a_clause_and_later_ones_only_when_long():
    turn = Turn("resp_1", "req_1", "item_1", 0.0, 1.0)
    deltas = ["Well, as you know, the answer", " is Paris, of course. It", " is big, old, and lovely. "]
    out, _ = await run_stage(SentenceAggregator(), [*(TextDelta(turn, d) for d in deltas),
                                                                    TextDone(turn, Reply())])
    sentences = [e.text for e in out if type(e).__name__ == "Sentence"]
    assert sentences == ["Well, as you know,", "the answer is Paris, of course.", "It is big, old, and lovely."]
    story = ("Once upon a time, in a land far, far away, there lived a fierce dragon named Ember, who loved to fly "
             "over the mountains and breathe fire on the villages below, and all the people there feared him.")
    out, _ = await run_stage(SentenceAggregator(), [TextDelta(turn, story + " "), TextDone(turn, Reply())])
    pieces = [e.text for e in out if type(e).__name__ == "Sentence"]
    assert pieces[:2] == ["Once upon a time,", "in a land far, far away, there lived a fierce dragon named Ember,"]
    assert all(len(p.split()) <= 20 for p in pieces) and " ".join(pieces) == story


async def test_the_llm_deadline_follows_the_audio_the_caller_has_buffered():
    clock, pacing = PlaybackClock(), Pacing(tts_estimate_s=0.4, chars_per_s=10.0)
    turn = Turn("resp_1", "req_1", "item_1", 100.0, 101.5)
    assert pacing.llm_deadline(turn, 100.0) == pytest.approx(101.1)  # before audio: the turn's deadline
    start, _ = clock.schedule(3.0, 102.0)  # the first audio (a gap before it is no underrun)
    assert start == 102.0
    pacing.played(turn, clock.playout_end)  # as the output stage reports it
    assert pacing.llm_deadline(turn, 102.0) == pytest.approx(104.6)  # the buffer runs dry at 105
    pacing.expect(turn, 1, "x" * 20)  # a sentence being synthesized: 2 s more audio to come
    assert pacing.llm_deadline(turn, 102.0) == pytest.approx(106.6)
    pacing.synthesized(turn, 1, "x" * 20, audio_s=2.0, work_s=0.4)
    assert pacing.llm_deadline(turn, 102.0) == pytest.approx(104.6)
    assert clock.schedule(1.0, 106.0) == (106.0, 1.0)  # arriving after the buffer ran dry: a 1 s gap


async def test_scheduled_audio_moves_the_llm_deadline_through_feedback_until_the_text_is_done():
    call = Call(speculative=False)
    call.engine.gate.clear()  # the reply's tokens wait: the request is in flight
    await call.utterance()
    llm_stage, tts, output = (call.stage(kind) for kind in (LLMStage, TTSStage, ClientOutput))
    turn, request, pacing = llm_stage.turn, call.engine.requests[-1], tts.pacing
    before = len(request.deadlines)
    now = time.monotonic()  # the caller has 3 s of audio queued: TTS reads it on the way to the LLM stage
    output.emit_upstream(Played(turn, 0, "Paris.", now, 3.0, now + 3.0))
    await call.push()
    assert len(request.deadlines) == before + 1
    assert request.deadlines[-1] == pytest.approx(pacing.llm_deadline(turn, time.monotonic()), abs=0.05)
    call.engine.gate.set()
    await call.push()
    assert request.closed  # the reply's text is done
    output.emit_upstream(Played(turn, 1, "It is big.", now + 3.0, 1.0, now + 4.0))
    await call.push()
    assert len(request.deadlines) == before + 1  # a finished request's deadline no longer moves
    await call.close()


async def test_a_sentence_sent_to_synthesis_tells_the_llm_stage_its_deadline_moved():
    from support.fakes import FakeEngine, FakeTokenizer

    from voicepipe.pipeline.tts_stage import TTSStage

    stage = TTSStage(FakeEngine(FakeTokenizer()), 16000)
    turn = Turn("resp_1", "req_1", "item_1", time.monotonic(), time.monotonic() + 1.5)
    before = stage.pacing.llm_deadline(turn, time.monotonic())
    down, up = await run_stage(stage, [ResponseCreated(turn), Sentence(turn, "Paris is the capital.", 0)])
    assert [type(e) for e in up] == [Paced, Paced] and [type(e) for e in down] == [ResponseCreated]
    assert up[0].due == pytest.approx(before, abs=0.05)  # the new turn's deadline, at once
    assert up[1].due > up[0].due  # the sentence's audio counts as coming
    now = time.monotonic()
    _, up = await run_stage(stage, [Played(turn, 0, "Paris is the capital.", now, 2.0, now + 2.0)])
    assert [type(e) for e in up] == [Paced, Played]  # the clock read on the output's report, passed on
    assert up[0].due >= now + 2.0 - stage.pacing.tts_estimate_s  # due before the 2 s buffered run out
    await run_stage(stage, [TurnCancelled(turn, "barge_in", Reply())])  # its synthesis worker stops


def test_words_two_passes_agree_on_are_committed():
    agreement = Agreement()
    assert agreement.update("what is the") == ("", "what is the")
    assert agreement.update("What is the capital") == ("What is the", "What is the capital")
    assert agreement.update("what is a capital of") == ("", "What is the capital of")  # committed words stay
    assert agreement.committed == ["What", "is", "the"]


LONG_REPLY = " ".join(f"Sentence number {n} is here." for n in range(8))


async def speak_over(call: Call, words: str) -> str:
    """After a finished reply whose audio (4 s of it) is still playing, the caller says `words` over it;
    returns the reply's item id."""
    await call.utterance()
    reply_id = call.client.of(ServerEvent.RESPONSE_CREATED)[0]["response"]["output"][0]["id"]
    assert call.client.of(ServerEvent.RESPONSE_DONE)[0]["response"]["status"] == "completed"
    await call.push(SpeechStarted("item_2", 0, time.monotonic()))
    assert call.client.kinds()[-1] == ServerEvent.SPEECH_STARTED  # the start of speech alone stops nothing
    await call.push(BargeIn("item_2"))
    assert call.client.kinds()[-1] == ServerEvent.PLAYBACK_CLEARED  # enough speech: the audio stops
    call.asr.text = words  # what the ASR hears in the caller's new utterance
    await call.push(SpeechAudio("item_2", np.zeros(SECOND, np.float32), True),
                    SpeechStopped("item_2", 1000, time.monotonic(), SECOND))
    return reply_id


async def test_speaking_words_over_the_reply_cuts_it_and_keeps_what_was_heard():
    call = Call(reply=LONG_REPLY)
    reply_id = await speak_over(call, "Wait, tell me about Spain instead.")
    heard = call.conversation.get(reply_id)["content"]
    assert len(heard.split()) < 8, heard  # at most a little of the first sentence was played
    assert call.client.kinds().count(ServerEvent.RESPONSE_CREATED) == 2  # and the new words are answered
    assert unheard(call, "barge_in") > 0  # the rest of the reply, counted as thrown away
    await call.close()


def unheard(call: Call, why: str) -> float:
    return call.runtime.registry.get_sample_value("voicepipe_reply_audio_unheard_seconds_total", {"why": why}) or 0.0


async def test_the_reply_to_words_said_over_a_reply_reads_only_what_was_heard_of_it():
    call = Call(reply=LONG_REPLY)
    reply_id = await speak_over(call, "Wait, tell me about Spain instead.")
    heard = call.conversation.get(reply_id)["content"]
    said = [call.tokenizer.strings[i] for i in call.engine.requests[-1].prompt]
    assert f"assistant: {heard}" in said if heard else not any(s.startswith("assistant") for s in said)
    assert f"assistant: {LONG_REPLY}" not in said  # cut before the next prompt was written
    await call.close()


async def test_a_backchannel_over_the_reply_lets_it_go_on_where_it_stopped():
    call = Call(reply=LONG_REPLY)
    frames_before = sum(isinstance(m, bytes) for m in call.client.messages)
    reply_id = await speak_over(call, "Mm-hmm.")
    cleared = max(i for i, m in enumerate(call.client.messages) if isinstance(m, dict)
                  and m["type"] == ServerEvent.PLAYBACK_CLEARED)
    resent = [m for m in call.client.messages[cleared:] if isinstance(m, bytes)]
    assert resent and sum(len(m) for m in resent) < sum(
        len(m) for m in call.client.messages[:cleared] if isinstance(m, bytes))  # the rest, not all again
    assert frames_before == 0 and call.conversation.get(reply_id)["content"] == LONG_REPLY
    assert call.client.kinds().count(ServerEvent.RESPONSE_CREATED) == 1  # "mm-hmm" gets no reply of its own
    assert [i["role"] for i in call.conversation.items] == ["user", "assistant"]
    assert unheard(call, "barge_in") == 0  # played on: nothing thrown away
    await call.close()


async def test_a_truncated_item_keeps_the_words_of_the_audio_played():
    call = Call()
    await call.utterance()
    reply_id = call.client.of(ServerEvent.RESPONSE_CREATED)[0]["response"]["output"][0]["id"]
    first = "Paris is the capital of France."
    ms = len(first.split()) * 100  # the fake voice speaks a word per 100 ms
    await call.push(TruncateRequested(reply_id, ms))
    assert call.conversation.get(reply_id)["content"] == first + "…"  # marked where it was cut
    assert call.client.of(ServerEvent.ITEM_TRUNCATED)[0]["audio_end_ms"] == ms
    await call.push(TruncateRequested("item_unknown", 10))
    assert call.client.of(ServerEvent.ERROR)[-1]["error"]["code"] == "item_not_found"
    await call.close()


async def test_an_item_read_right_after_its_truncate_reads_as_truncated():
    call = Call(reply=LONG_REPLY)
    await call.utterance()
    reply_id = call.client.of(ServerEvent.RESPONSE_CREATED)[0]["response"]["output"][0]["id"]
    await call.push(TruncateRequested(reply_id, 400), ItemRequested(reply_id, "retrieve"))  # not waiting between
    retrieved = call.client.of(ServerEvent.ITEM_RETRIEVED)[0]["item"]["content"][0]
    assert retrieved["transcript"] == "Sentence number 0 is…"
    await call.close()


async def test_a_text_item_is_answered_only_when_a_response_is_asked_for():
    call = Call()
    await call.push(ItemCreated("item_t", "user", QUESTION))
    assert call.client.kinds() == [ServerEvent.ITEM_ADDED, ServerEvent.ITEM_DONE]
    await call.push(ResponseRequested())
    assert call.client.kinds()[-1] == ServerEvent.RESPONSE_DONE
    assert [(i["id"], i["role"]) for i in call.conversation.items][0] == ("item_t", "user")
    assert call.conversation.items[1]["content"] == REPLY
    await call.close()


async def test_the_metadata_of_a_response_request_comes_back_in_its_response_created():
    call = Call()
    await call.push(ItemCreated("item_m", "user", QUESTION))
    await call.push(ResponseRequested({"client_event_id": "evt_42"}))
    created = call.client.of(ServerEvent.RESPONSE_CREATED)[-1]["response"]
    assert created["metadata"] == {"client_event_id": "evt_42"}
    await call.close()


async def test_a_reply_paused_by_speech_the_client_then_clears_plays_on():
    call = Call(reply=LONG_REPLY)
    await call.utterance()
    await call.push(SpeechStarted("item_2", 0, time.monotonic()), BargeIn("item_2"))
    assert call.client.kinds()[-1] == ServerEvent.PLAYBACK_CLEARED
    frames = sum(isinstance(m, bytes) for m in call.client.messages)
    await call.push(InputCleared("item_2"))  # input_audio_buffer.clear: the interruption is gone unheard
    assert sum(isinstance(m, bytes) for m in call.client.messages) > frames  # the rest of the reply follows
    await call.close()


def test_what_was_heard_is_whole_sentences_then_a_share_of_the_one_playing():
    from voicepipe.pipeline.heard import Heard

    heard = Heard()
    heard.add(0, "Paris is the capital.", start=10.0, seconds=2.0)
    heard.add(1, "It is a big old city.", start=12.0, seconds=3.0)
    assert heard.played_text(13.5) == "Paris is the capital. It is a"  # half of the second sentence
    assert heard.text_until(2.0) == "Paris is the capital."  # a client that played 2 s of it
    heard.cut(11.0)  # the caller spoke at 11 s: half the first sentence, nothing after
    assert heard.played_text(20.0) == "Paris is" and heard.stopped_at == 11.0
    heard.stopped_at = None  # it was only a backchannel: the rest plays on from the pause
    heard.add(0, "Paris is the capital.", start=11.5, seconds=1.0, resumed=True)
    heard.add(1, "It is a big old city.", start=12.5, seconds=3.0, resumed=True)
    assert heard.played_text(20.0) == "Paris is the capital. It is a big old city."
    assert heard.played_text(14.0) == "Paris is the capital. It is a"


def test_where_the_voice_tells_where_each_word_ends_what_was_heard_is_cut_at_the_word():
    from voicepipe.pipeline.heard import Heard

    heard = Heard()
    # A long first word: by its share of the audio, 0.9 s of 2 s is one word of four; by its timings, two.
    heard.add(0, "Extraordinarily warm days ahead.", start=0.0, seconds=2.0, ends=(0.8, 1.1, 1.6, 2.0))
    assert heard.text_until(0.9) == "Extraordinarily"
    assert heard.text_until(1.12) == "Extraordinarily warm"  # its last 20 ms cut off: heard all the same
    assert heard.text_until(1.5) == "Extraordinarily warm"
    heard.cut(1.65)
    assert heard.played_text(5.0) == "Extraordinarily warm days"
    unmatched = Heard()  # timings that do not match the words fall back to the share of the audio
    unmatched.add(0, "One two three four.", start=0.0, seconds=2.0, ends=(0.5, 2.0))
    assert unmatched.text_until(1.0) == "One two"


async def test_the_first_phrase_goes_to_synthesis_before_its_sentence_ends_and_no_word_is_split():
    turn = Turn("resp_1", "req_1", "item_1", 0.0, 1.0)
    reply = "The capital of France is Paris which is known for its art and food. It is lovely."
    deltas = [reply[i:i + 3] for i in range(0, len(reply), 3)]  # tokens cut mid-word, as an LLM streams them
    stage = SentenceAggregator()
    sent_at: list[int] = []  # how many deltas had arrived when each piece went to synthesis
    out = []
    for n, delta in enumerate(deltas):
        new, _ = await run_stage(stage, [TextDelta(turn, delta)])
        out += new
        sent_at += [n + 1 for e in new if type(e).__name__ == "Sentence"]
    new, _ = await run_stage(stage, [TextDone(turn, Reply())])
    pieces = [e.text for e in out + new if type(e).__name__ == "Sentence"]
    assert pieces[0] == "The capital of France is Paris"  # a phrase, ended before "which"
    assert sent_at[0] * 3 < reply.index(".")  # sent before the first clause (the sentence) was written
    assert " ".join(pieces).split() == reply.split()  # every word whole, in one piece, in order
    assert pieces[1:] == ["which is known for its art and food.", "It is lovely."]  # then whole sentences


def test_the_waterfall_adds_up_to_the_first_audio_when_stages_overlap():
    # A speculative reply: its first token came before the end of the turn was decided, and its first
    # phrase was synthesized while the decision was still pending.
    timings = {Mark.PAUSE: 0.19, Mark.TRANSCRIPT: 0.31, Mark.REPLY_STARTED: 0.31, Mark.FIRST_TOKEN: 0.42,
               Mark.FIRST_PHRASE: 0.55, Mark.END_CONFIRMED: 0.6, Mark.SYNTHESIZED: 0.8, Mark.FIRST_AUDIO: 0.81}
    stages = waterfall(timings)
    assert list(stages) == ["pause", "asr", "prefill", "first_phrase", "decision", "synthesis", "send"]
    assert stages["decision"] == pytest.approx(0.05)  # only what the decision added after the phrase
    assert sum(stages.values()) == pytest.approx(0.81)
    del timings[Mark.FIRST_AUDIO]
    assert waterfall(timings) == {}  # no audio, no waterfall


async def test_a_long_reply_is_synthesized_no_further_ahead_than_the_horizon_and_a_cancel_stops_it():
    """Twenty sentences of 0.3 s each: with a 0.5 s horizon, a second into the reply only the sentences the
    caller is about to hear were synthesized; once it is cancelled, none more, and what the caller never heard
    (counted in the metrics) is less than a second, where synthesizing it all threw most of the story away."""
    import asyncio

    from voicepipe.backends.loading import TTS_SENTENCE
    from voicepipe.pipeline.requests import CancelRequested

    story = " ".join(["One two three."] * 20)
    synthesized, unheard = [], []
    for horizon in (0.5, 60.0):
        call = Call(reply=story, synthesis_horizon_s=horizon)
        await call.utterance()
        await asyncio.sleep(1.0)
        synthesized.append(sum(kind == TTS_SENTENCE for kind, _ in call.engine.jobs))
        await call.push(CancelRequested())
        await asyncio.sleep(0.5)
        assert sum(kind == TTS_SENTENCE for kind, _ in call.engine.jobs) <= synthesized[-1] + 1
        unheard.append(sum(sample.value for family in call.runtime.registry.collect() for sample in family.samples
                           if sample.name == "voicepipe_reply_audio_unheard_seconds_total"))
        await call.close()
    assert 3 <= synthesized[0] <= 8 and synthesized[1] == 20, synthesized
    assert 0 < unheard[0] < 1.2 and unheard[1] > 3.5, unheard


async def test_a_sentence_synthesized_ahead_is_asked_for_again_as_the_turns_once_its_turn_is_confirmed():
    """A speculative reply's synthesis waits behind other work (an interactive job); if it has not run by the
    time its turn is confirmed, the turn's own (realtime) request for it goes in, and the reply is heard."""
    call = Call()
    held = asyncio.Event()  # interactive synthesis never gets its turn here: old requests keep the device

    async def run_job(kind, *args, cls=RequestClass.INTERACTIVE, deadline=None):
        call.engine.jobs.append((kind, cls))
        if kind == "tts" and cls is RequestClass.INTERACTIVE:
            await held.wait()
        handler = call.engine.handlers[kind]
        return handler.fn([args])[0] if handler.batch > 1 else handler.fn(*args)

    call.engine.run_job = run_job
    await call.utterance(pause=True, stop=False)
    assert ("tts", RequestClass.INTERACTIVE) in call.engine.jobs and "response.done" not in call.client.kinds()
    await call.push(SpeechStopped("item_1", 1000, time.monotonic(), SECOND))
    for _ in range(200):
        if "response.done" in call.client.kinds():
            break
        await asyncio.sleep(0.01)
    assert ("tts", RequestClass.REALTIME) in call.engine.jobs
    assert call.client.of("response.done")[0]["response"]["status"] == "completed"
    assert any(isinstance(m, bytes) for m in call.client.messages)  # its audio was sent
    await call.close()
