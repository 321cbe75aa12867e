"""Speculative replies: a reply starts at the caller's first pause and is heard only if the pause was the
end of the utterance; otherwise it is dropped unheard and the whole utterance gets one reply."""

import numpy as np
import pytest
from support.helpers import SAMPLE_RATE, Call, pinned_pages, response_id, settled

from scheduler import RequestClass
from voicepipe.audio import read_audio

pytestmark = pytest.mark.asyncio(loop_scope="module")
# A long confirmation window, so the pass at the pause (200 ms into the silence) surely ends inside it.
SLOW_STOP = {"type": "session.update",
             "session": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 2000}}}


@pytest.fixture
def requests(runtime, monkeypatch) -> list:
    """Every sequence the engine is given during the test."""
    seen = []
    add = runtime.engine.core.add_request

    def spy(seq):
        seen.append(seq)
        return add(seq)

    monkeypatch.setattr(runtime.engine.core, "add_request", spy)
    return seen


async def no_leaks(runtime) -> None:
    held = await settled(runtime.engine)
    assert held["pool_error"] is None
    assert held["used_pages"] == pinned_pages(held) + held["cached_pages"]  # nothing but kept prefixes


async def test_a_reply_started_at_the_pause_is_kept_when_the_caller_stays_silent(server, runtime, speech_wav,
                                                                                 words, requests):
    call = await Call.open(server)
    try:
        await call.send(SLOW_STOP)
        await call.wait("session.updated", timeout=30)
        await call.speak(read_audio(speech_wav("What is the capital of France?"), SAMPLE_RATE), silence_s=3.0)
        done = (await call.wait("response.done"))["response"]
        session = next(s for s in server.calls if s.id == call.session_id)
        assert done["status"] == "completed" and len(call.of("response.created")) == 1
        timings = done["timings"]  # from the caller's last word: the reply began before its end was confirmed
        assert 0 < timings["reply_started_s"] < timings["end_confirmed_s"] <= timings["first_audio_s"]
        heard = call.kinds().index("conversation.item.input_audio_transcription.completed")
        assert call.kinds().index("response.created") > heard  # ...and announced only after the transcript
        turn = [s for s in requests if s.request_id.endswith(done["id"])]
        assert len(turn) == 1 and turn[0].finish_reason in ("stop", "length")  # one request, kept to its end
        roles = [item["role"] for item in session.conversation.items]
        assert roles == ["user", "assistant"]
        assert {"capital", "france"} <= words(session.conversation.items[0]["content"])
        assert session.conversation.items[1]["content"].strip()
        await no_leaks(runtime)
    finally:
        await call.close()


async def test_a_reply_started_at_the_pause_is_dropped_when_the_caller_goes_on(server, runtime, speech_wav,
                                                                               words, requests):
    first = read_audio(speech_wav("I have a question."), SAMPLE_RATE)
    rest = read_audio(speech_wav("What is the capital of Italy?"), SAMPLE_RATE)
    gap = np.zeros(int(0.9 * SAMPLE_RATE), np.float32)  # a pause, well short of the 2 s end of speech
    call = await Call.open(server)
    try:
        await call.send(SLOW_STOP)
        await call.wait("session.updated", timeout=30)
        await call.speak(np.concatenate([first, gap, rest]), silence_s=3.0)
        done = (await call.wait("response.done"))["response"]
        session = next(s for s in server.calls if s.id == call.session_id)
        # A speculative reply is REALTIME (its prefill also decides the turn); the dropped one was aborted.
        dropped = [s for s in requests if s.cls is RequestClass.REALTIME and s.finish_reason == "abort"
                   and call.session_id in s.request_id]
        assert dropped, "no reply was started at the pause"
        assert len(call.of("response.created")) == 1 and len(call.of("response.done")) == 1
        assert response_id(call.of("response.created")[0]) == done["id"] and done["status"] == "completed"
        transcript = call.of("conversation.item.input_audio_transcription.completed")
        assert len(transcript) == 1 and {"question", "capital", "italy"} <= words(transcript[0]["transcript"])
        # The conversation holds the whole utterance once, and only the reply that was heard.
        assert [item["role"] for item in session.conversation.items] == ["user", "assistant"]
        assert {"question", "capital", "italy"} <= words(session.conversation.items[0]["content"])
        await no_leaks(runtime)
    finally:
        await call.close()
