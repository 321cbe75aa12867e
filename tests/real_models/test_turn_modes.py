"""Turn-taking with the real models over the real websocket: the LLM's end-of-turn decisions on generated
finished and cut sentences, a sentence with a pause inside answered as one turn (semantic) or two (silence),
and speech over a reply: a backchannel lets it play on, words cancel it."""

import numpy as np
import pytest
from support.helpers import SAMPLE_RATE, Call

from voicepipe.audio import read_audio
from voicepipe.bench.turn_set import espeak_samples, turn_set
from voicepipe.bench.turns import decisions

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_llm_tells_finished_sentences_from_cut_ones(runtime):
    samples = turn_set(voices=("en-us", "en-gb"), questions=8)
    report = await decisions(runtime, samples)
    medium = report["llm"]["eagerness"]["medium"]
    assert medium["ended_at_the_pause"] >= 0.6, medium  # most finished questions end at the first pause
    assert medium["false_cutoffs"] <= 0.3, medium  # and few cut ones before the caller goes on
    # Without Whisper's final punctuation the words say more than with it.
    assert report["llm"]["false_cutoffs"] <= report["llm_as_heard"]["false_cutoffs"], report


def paused_sentence() -> np.ndarray:
    """"Which planet is ... closest to the sun?", with a 0.9 s pause inside."""
    return espeak_samples("en-gb", "Which planet is", "closest to the sun?", 0.9)[2].audio


async def speak_paused_sentence(server, mode: str) -> Call:
    call = await Call.open(server)
    await call.send({"type": "session.update", "session": {"turn_detection": {"type": mode}}})
    await call.wait("session.updated", timeout=30)
    await call.speak(paused_sentence(), silence_s=0.0)
    return call


async def test_under_semantic_turns_a_pause_inside_a_sentence_keeps_it_one_turn(server, words):
    call = await speak_paused_sentence(server, "semantic_vad")
    try:
        assert not call.frames, "reply audio came before the caller had finished"
        await call.speak(np.zeros(0, np.float32), silence_s=3.0)
        await call.wait("response.done")
        transcripts = [e["transcript"] for e in call.of("conversation.item.input_audio_transcription.completed")]
        assert len(transcripts) == 1 and {"planet", "sun"} <= words(transcripts[0]), transcripts
        assert len(call.of("response.created")) == 1
    finally:
        await call.close()


async def test_under_server_vad_the_same_pause_ends_the_turn(server):
    call = await speak_paused_sentence(server, "server_vad")
    try:
        await call.speak(np.zeros(0, np.float32), silence_s=3.0)
        await call.wait("input_audio_buffer.speech_stopped")
        assert len(call.of("input_audio_buffer.speech_stopped")) == 2  # 500 ms of silence ended the first half
    finally:
        await call.close()


async def speak_over_the_reply(server, speech_wav, words_said: str) -> dict:
    """Ask for a long answer, then say `words_said` over it once its audio plays; its response.done."""
    call = await Call.open(server)
    try:
        await call.send({"type": "session.update", "session": {
            "instructions": "Answer in four long sentences.", "turn_detection": {"type": "server_vad"}}})
        await call.wait("session.updated", timeout=30)
        await call.speak(read_audio(speech_wav("Tell me about the city of Paris."), SAMPLE_RATE), silence_s=0.6)
        while not call.frames:
            await call.speak(np.zeros(0, np.float32), silence_s=0.1)
        await call.speak(read_audio(speech_wav(words_said), SAMPLE_RATE), silence_s=2.0)
        done = await call.wait("response.done")
        done["cleared"] = len(call.of("output_audio_buffer.cleared"))
        done["heard"] = [e["transcript"] for e in call.of("conversation.item.input_audio_transcription.completed")]
        return done
    finally:
        await call.close()


async def test_a_backchannel_over_the_reply_lets_it_play_on_and_words_cancel_it(server, speech_wav):
    # "Uh-huh": espeak-ng's default voice says "mm-hmm" so that Whisper hears "and momentum".
    kept = await speak_over_the_reply(server, speech_wav, "Uh-huh.")
    assert kept["response"]["status"] == "completed", kept
    cut = await speak_over_the_reply(server, speech_wav, "Stop. Tell me about Rome instead.")
    assert cut["response"]["status"] == "cancelled" and cut["cleared"] >= 1, cut
    assert cut["response"]["status_details"]["reason"] == "turn_detected"
