"""The OpenAI-compatible APIs, spoken to by the official `openai` SDK: chat completions (whole and
streamed), models, and a Realtime call with synthesized speech and with a text turn."""

import asyncio
import base64

import numpy as np
import openai
import pytest

from voicepipe.audio import read_audio, resample, to_float32, to_pcm16

pytestmark = pytest.mark.asyncio(loop_scope="module")

REALTIME_RATE = 24000
QUESTION = "What is the capital of France?"
TIMEOUT_S = 240


@pytest.fixture
def client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="not-needed", max_retries=0)


async def test_models_lists_the_engine_model(client, runtime):
    from voicepipe.backends.loading import model_name

    models = await client.models.list()
    assert [m.id for m in models.data] == [model_name(runtime.engine.core.runner.model)] != ["voicepipe"]
    assert (await client.models.retrieve(models.data[0].id)).id == models.data[0].id
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")


async def test_chat_completion_matches_the_engine_and_counts_tokens(client, runtime):
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    reply = await client.chat.completions.create(model="any", messages=messages, max_tokens=12, temperature=0)
    answer = reply.choices[0].message.content
    assert "paris" in answer.lower()
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens <= 12 and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    short = await client.chat.completions.create(model="any", messages=messages, max_tokens=1, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 1


async def test_streamed_chat_gives_the_same_text_as_whole(client):
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "Name a colour of the sky."}]}]
    whole = await client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0)
    stream = await client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0,
                                                  stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.choices[0].message.content and len(pieces) > 2
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


async def test_stop_strings_and_seeds(client):
    messages = [{"role": "user", "content": "Describe a cat in two sentences."}]
    free = (await client.chat.completions.create(model="any", messages=messages, max_tokens=24,
                                                 temperature=0)).choices[0].message.content
    stop = free.split()[len(free.split()) // 2]  # a word from the middle of the free answer
    stopped = await client.chat.completions.create(model="any", messages=messages, max_tokens=24, temperature=0,
                                                   stop=[stop])
    assert stopped.choices[0].message.content == free[:free.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    # The same seed four times, as the openai SDK's own check asks (the prompt's pages are cached after the first).
    sampled = [await client.chat.completions.create(model="any", messages=messages, max_tokens=40,
                                                    temperature=1.0, seed=seed) for seed in (1, 1, 1, 1, 2)]
    texts = [s.choices[0].message.content for s in sampled]
    assert len(set(texts[:4])) == 1, texts


async def test_bad_requests_get_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="any", messages=[], max_tokens=4)
    assert e.value.body["code"] == "invalid_value"
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}],
                                             temperature=5)
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="any", messages=[{"role": "user", "content": "word " * 20000}])
    assert e.value.body["code"] == "context_length_exceeded"


# -- the Realtime API ----------------------------------------------------------------------------------------
def pcm24(audio16k: np.ndarray) -> bytes:
    return to_pcm16(resample(audio16k, 16000, REALTIME_RATE)).astype("<i2").tobytes()


async def events_until(conn, kind: str, seen: list) -> object:
    async with asyncio.timeout(TIMEOUT_S):
        async for event in conn:
            seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"the connection ended before {kind}")


async def test_realtime_call_with_speech(client, server, speech_wav, asr, words):
    question = read_audio(speech_wav(QUESTION), 16000)
    async with client.realtime.connect(model="voicepipe") as conn:
        seen: list = []
        created = await events_until(conn, "session.created", seen)
        assert created.session.audio.output.format.rate == REALTIME_RATE
        await conn.session.update(session={
            "type": "realtime", "instructions": "Answer in one short sentence.",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": REALTIME_RATE},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500,
                                                   "create_response": True}},
                      "output": {"format": {"type": "audio/pcm", "rate": REALTIME_RATE}, "voice": "alloy"}},
            "tools": []})  # tools and the voice are ignored, with a warning in the server's log
        updated = await events_until(conn, "session.updated", seen)
        assert updated.session.instructions == "Answer in one short sentence."
        audio = pcm24(np.concatenate([question, np.zeros(16000, np.float32)]))
        step = REALTIME_RATE // 10 * 2  # 100 ms of PCM16
        for offset in range(0, len(audio), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[offset:offset + step]).decode())
            await asyncio.sleep(0.05)  # twice real time
        done = await events_until(conn, "response.done", seen)
    kinds = [e.type for e in seen]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                 "response.created", "response.output_item.added", "response.output_audio.delta",
                 "response.output_audio_transcript.delta", "response.output_item.done"):
        assert kind in kinds, f"no {kind} in {kinds}"
    assert kinds.index("response.created") < kinds.index("response.output_audio.delta")
    transcript = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    assert {"capital", "france"} <= words(transcript.transcript)
    assert all(getattr(e, "event_id", None) for e in seen)
    assert done.response.status == "completed" and done.response.usage.output_tokens > 0
    said = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    reply = np.frombuffer(b"".join(base64.b64decode(e.delta) for e in seen
                                   if e.type == "response.output_audio.delta"), "<i2")
    assert len(reply) > REALTIME_RATE // 2, "less than half a second of reply audio"
    heard = asr.transcribe(resample(to_float32(reply), REALTIME_RATE, 16000))
    assert len(words(heard) & words(said)) >= max(1, len(words(said)) // 2), (heard, said)


@pytest.mark.parametrize("coding", ["pcmu", "pcma"])
async def test_realtime_call_in_phone_audio(client, speech_wav, asr, words, coding):
    """G.711 both ways at 8 kHz, as a telephony bridge sends and plays it: heard, answered, and the answer
    is speech (Whisper hears its own words in it)."""
    from voicepipe.wire_audio import PCMA, PCMU

    codec = {"pcmu": PCMU, "pcma": PCMA}[coding]
    question = read_audio(speech_wav(QUESTION), 16000)
    async with client.realtime.connect(model="voicepipe") as conn:
        seen: list = []
        await events_until(conn, "session.created", seen)
        await conn.session.update(session={"type": "realtime", "instructions": "Answer in one short sentence.",
                                           "audio": {"input": {"format": {"type": f"audio/{coding}"}},
                                                     "output": {"format": {"type": f"audio/{coding}"}}}})
        updated = await events_until(conn, "session.updated", seen)
        assert updated.session.audio.input.format.type == updated.session.audio.output.format.type == f"audio/{coding}"
        phone = codec.encode(to_pcm16(resample(np.concatenate([question, np.zeros(16000, np.float32)]), 16000, 8000)))
        for offset in range(0, len(phone), 800):  # 100 ms of 8-bit samples
            await conn.input_audio_buffer.append(audio=base64.b64encode(phone[offset:offset + 800]).decode())
            await asyncio.sleep(0.05)
        await events_until(conn, "response.done", seen)
    transcript = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    assert {"capital", "france"} <= words(transcript.transcript)
    said = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    coded = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
    reply = codec.decode(coded)
    assert len(reply) == len(coded) > 8000 // 2, "less than half a second of reply audio"
    heard = asr.transcribe(resample(to_float32(reply), 8000, 16000))
    assert len(words(heard) & words(said)) >= max(1, len(words(said)) // 2), (heard, said)


async def test_realtime_text_turn_and_cancel(client):
    async with client.realtime.connect(model="voicepipe") as conn:
        seen: list = []
        await events_until(conn, "session.created", seen)
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Say hello."}]})
        added = await events_until(conn, "conversation.item.added", seen)
        assert added.item.role == "user" and added.previous_item_id is None  # the first item
        await conn.response.create(response={"metadata": {"client_event_id": "evt_1"}})
        done = await events_until(conn, "response.done", seen)
        assert done.response.status == "completed"
        assert any(e.type == "response.output_audio.delta" for e in seen)
        created = next(e for e in seen if e.type == "response.created")
        assert created.response.metadata == {"client_event_id": "evt_1"}  # how clients match their reply
        reply = [e for e in seen if e.type == "conversation.item.added"][-1]
        assert reply.item.role == "assistant" and reply.previous_item_id == added.item.id  # mirrored in order
        # A long answer, cancelled as soon as it starts: it ends as cancelled, and the call goes on.
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me about the history of Paris in detail."}]})
        await conn.response.create()
        await events_until(conn, "response.created", seen)
        await conn.response.cancel()
        done = await events_until(conn, "response.done", seen)
        assert done.response.status == "cancelled"
        await conn.send({"type": "no.such.event"})
        error = await events_until(conn, "error", seen)
        assert error.error.code == "unknown_event"


async def test_realtime_manual_turns_wait_for_the_clients_commit_and_response_create(client, speech_wav, words):
    question = read_audio(speech_wav(QUESTION), 16000)
    async with client.realtime.connect(model="voicepipe") as conn:
        seen: list = []
        await events_until(conn, "session.created", seen)
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        updated = await events_until(conn, "session.updated", seen)
        assert updated.session.audio.input.turn_detection is None
        audio = pcm24(np.concatenate([question, np.zeros(24000, np.float32)]))
        step = REALTIME_RATE // 10 * 2
        for offset in range(0, len(audio), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[offset:offset + step]).decode())
            await asyncio.sleep(0.05)
        await conn.input_audio_buffer.commit()
        transcript = await events_until(conn, "conversation.item.input_audio_transcription.completed", seen)
        assert {"capital", "france"} <= words(transcript.transcript)
        with pytest.raises(TimeoutError):  # the server says nothing more until it is asked
            while True:
                seen.append(await asyncio.wait_for(conn.recv(), 2.0))
        kinds = [e.type for e in seen]
        assert "input_audio_buffer.speech_started" not in kinds and "response.created" not in kinds
        await conn.response.create()
        assert (await events_until(conn, "response.done", seen)).response.status == "completed"
        # Semantic turns, and back: each mode reads back as set.
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": "high", "interrupt_response": False}}}})
        detection = (await events_until(conn, "session.updated", seen)).session.audio.input.turn_detection
        assert (detection.type, detection.eagerness, detection.interrupt_response) == ("semantic_vad", "high", False)


async def test_beta_clients_get_the_beta_names(server):
    """A client that asks for the beta dialect reads its event names, and may send its session shape."""
    import json

    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    async with connect(url, additional_headers={"OpenAI-Beta": "realtime=v1"}, max_size=None) as ws:
        kinds: list[str] = []

        async def until(kind: str) -> dict:
            async with asyncio.timeout(TIMEOUT_S):
                while True:
                    event = json.loads(await ws.recv())
                    kinds.append(event["type"])
                    if event["type"] == kind:
                        return event

        created = await until("session.created")
        assert created["session"]["input_audio_format"] == "pcm16"
        await ws.send(json.dumps({"type": "session.update", "session": {
            "input_audio_format": "pcm16", "output_audio_format": "pcm16", "modalities": ["audio", "text"],
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 600}}}))
        updated = await until("session.updated")
        assert updated["session"]["turn_detection"]["silence_duration_ms"] == 600
        for detection in ({"type": "semantic_vad", "eagerness": "low"}, None):  # the beta's other two modes
            await ws.send(json.dumps({"type": "session.update", "session": {"turn_detection": detection}}))
            updated = await until("session.updated")
            assert (updated["session"]["turn_detection"] or {}).get("eagerness") == (detection or {}).get("eagerness")
            assert (updated["session"]["turn_detection"] is None) is (detection is None)
        await ws.send(json.dumps({"type": "session.update", "session": {"input_audio_format": "g729"}}))
        assert (await until("error"))["error"]["code"] == "unsupported_session"
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        await until("response.done")
    assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds
    assert "response.audio.delta" in kinds and "response.output_audio.delta" not in kinds
    assert "response.audio_transcript.delta" in kinds


async def test_a_client_leaving_a_stream_aborts_its_request(client, runtime):
    from support.helpers import settled

    engine = runtime.engine.core

    def generated() -> float:
        return engine.metrics.registry.get_sample_value("voicepipe_generation_tokens_total",
                                                        {"cls": "INTERACTIVE"}) or 0.0

    before = generated()
    stream = await client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Tell me about the history of Paris in detail."}],
        max_tokens=200, temperature=0, stream=True)
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks == 3:
            break
    await stream.close()
    await settled(runtime.engine, timeout=60)  # waits for the abort: nothing is left running for nobody
    engine.planner.check_pool()
    assert not engine.requests
    assert generated() - before < 100, "the request ran on after its client left"
