"""The stages on the real embedded models: what is said is heard, answered, and spoken back."""

import numpy as np

from voicepipe.audio import read_audio, resample, to_float32
from voicepipe.backends.base import GenerationParams, chat_prompt_ids
from voicepipe.pipeline.instructions import build_messages
from voicepipe.pipeline.sentence_split import split_ready

QUESTION = "What is the capital of France?"


async def collect(hf_llm, messages, params) -> str:
    return "".join([delta async for delta in hf_llm.stream(messages, params)])


def test_asr_hears_the_question(asr, speech_wav, words):
    text = asr.transcribe(read_audio(speech_wav(QUESTION), asr.sample_rate))
    assert {"capital", "france"} <= words(text), text


def test_asr_of_no_audio_is_empty(asr):
    assert asr.transcribe(np.zeros(0, dtype=np.float32)) == ""


def test_tts_round_trip_recovers_the_words(asr, tts, words):
    sentence = "The weather is sunny today. Please bring a hat."
    chunks = list(tts.synthesize(sentence))
    assert len(chunks) == 2  # one per sentence
    assert all(c.dtype == np.int16 and c.ndim == 1 and c.size for c in chunks)
    heard = asr.transcribe(resample(to_float32(np.concatenate(chunks)), tts.sample_rate, asr.sample_rate))
    missed = words(sentence) - words(heard)
    assert len(missed) <= 1, heard


def test_chat_prompt_ids_are_plain_ints(llm):
    _, tokenizer = llm
    messages = build_messages(QUESTION)
    ids = chat_prompt_ids(tokenizer, messages)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]


async def test_llm_answers_paris(hf_llm):
    answer = await collect(hf_llm, build_messages(QUESTION), GenerationParams(max_tokens=48))
    assert "paris" in answer.lower(), answer


async def test_streaming_matches_generate_ids(hf_llm, llm):
    _, tokenizer = llm
    messages = build_messages("Name three colours of the rainbow.")
    new_ids = hf_llm.generate_ids(chat_prompt_ids(tokenizer, messages), 24)
    assert 0 < len(new_ids) <= 24
    streamed = await collect(hf_llm, messages, GenerationParams(max_tokens=24))
    assert streamed == tokenizer.decode(new_ids, skip_special_tokens=True)


async def test_stream_stops_before_a_stop_string(hf_llm):
    messages = build_messages(QUESTION)
    full = await collect(hf_llm, messages, GenerationParams(max_tokens=48))
    cut = await collect(hf_llm, messages, GenerationParams(max_tokens=48, stop=["Paris"]))
    assert "Paris" in full and "Paris" not in cut
    assert full.startswith(cut) and full[len(cut):].startswith("Paris")


def test_streamed_text_is_released_in_whole_sentences():
    out, rest = [], ""
    for delta in ["Paris is", " the capital. It is", " big! Pi is 3.14", " or so"]:
        done, rest = split_ready(rest + delta, None)
        out += done
    assert out == ["Paris is the capital.", "It is big!"]
    assert rest.strip() == "Pi is 3.14 or so"
