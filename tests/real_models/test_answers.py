"""The default configuration answers spoken questions correctly: the spoken set of questions with known
answers, heard by the default ASR and answered by the default model with the default instructions,
sampling and precision, as a call would."""

import re

import pytest

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from voicepipe.audio import read_audio
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.backends.loading import DEFAULT_PRECISION
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.instructions import DEFAULT_INSTRUCTIONS, build_messages

NUMBERS = {"three": "3", "seven": "7", "eight": "8", "24": "twenty-four", "32": "thirty-two", "60": "sixty",
           "100": "hundred"}
# Measured: 21 of 24 answered from the written questions (float32); spoken in the Piper voice, heard by
# Whisper and answered with int8 weights, 18 of 24 ("who wrote..." misheard, Neptune for Jupiter, ...); with
# the C++ kernels' int4 and int8 weights, 19 of 24 each. Piper's speech varied from session to session, and
# with it the count (16 to 19 of 24, int4); the seeded set now heard every session gets 17, its misses the
# model's own (Neptune, -18 degrees, 3600 minutes).
AT_LEAST = 16


def answers(text: str, keyword: str) -> bool:
    """Whether `text` holds the expected answer (a number in words or in digits)."""
    said = " ".join(re.findall(r"[a-z0-9'-]+", text.lower()))
    forms = (keyword.lower(), NUMBERS.get(keyword.lower(), ""))
    return any(re.search(rf"\b{re.escape(k)}\b", said) for k in forms if k)


def test_answer_matching_takes_numbers_in_words_or_digits():
    assert answers("A spider has 8 legs.", "eight") and answers("Seven days.", "seven")
    assert not answers("It has eighty legs.", "eight") and not answers("Paris.", "Rome")


@pytest.mark.slow
def test_the_default_configuration_answers_the_spoken_questions(llm, asr, spoken_questions):
    model, tokenizer = llm
    config = CallConfig()
    engine = Engine(model, tokenizer, EngineConfig(precision=DEFAULT_PRECISION))
    asked = []
    for voice, _, keyword, path in spoken_questions:
        if voice != "piper":
            continue
        heard = asr.transcribe(read_audio(path, asr.sample_rate))
        prompt = chat_prompt_ids(tokenizer, build_messages(heard, config.instructions))
        params = SamplingParams(max_tokens=40, temperature=config.temperature)
        asked.append((heard, keyword, engine.add_request(Sequence(prompt, params))))
    while engine.step():
        pass
    right = [heard for heard, keyword, seq in asked if answers(seq.text, keyword)]
    wrong = [(heard, seq.text) for heard, keyword, seq in asked if not answers(seq.text, keyword)]
    assert config.instructions == DEFAULT_INSTRUCTIONS and len(asked) >= 20
    assert len(right) >= AT_LEAST, wrong
