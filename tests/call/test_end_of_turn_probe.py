"""The end-of-turn verdict read inside the speculative reply's own prefill: the same probability as the
judge's request of its own, on the tiny random-weight model with the default model's tokenizer (fp32)."""

import pytest

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.pipeline.end_of_turn import judged_prompt, probe_params, probe_position, sentence_end_tokens

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "Hi! How can I help?"}]


@pytest.fixture(scope="module")
def tiny_llm():
    from voicepipe.backends.models import load_tokenizer
    from voicepipe.bench.random_weights import random_llm

    tokenizer = load_tokenizer()
    model, _ = random_llm("tiny", vocab_size=len(tokenizer))
    return model, tokenizer


def prompts(tokenizer, words: str) -> tuple[list[int], list[int]]:
    """The reply's prompt for the caller's words as heard, and what the judge reads (them unpunctuated)."""
    reply = chat_prompt_ids(tokenizer, [*CONVERSATION, {"role": "user", "content": words}])
    judged = judged_prompt(tokenizer, chat_prompt_ids(tokenizer, [*CONVERSATION,
                                                                 {"role": "user", "content": words.rstrip("?.!")}]))
    return reply, judged


def run(engine: Engine, *seqs: Sequence) -> dict[str, list]:
    for seq in seqs:
        engine.add_request(seq)
    outputs: dict[str, list] = {s.request_id: [] for s in seqs}
    while engine.step():
        for request_id, out in engine.take_outputs()[0]:
            outputs[request_id].append(out)
    return outputs


@pytest.mark.parametrize("shard_tokens", [4, 64])  # the probed position in an earlier shard, or the last one
def test_the_verdict_read_in_the_replys_prefill_equals_the_judges_own_request(tiny_llm, shard_tokens):
    model, tokenizer = tiny_llm
    engine = Engine(model, tokenizer, EngineConfig(shard_tokens=shard_tokens, page_tokens=16, runner="lean"))
    reply, judged = prompts(tokenizer, "What is the capital of France?")
    at = probe_position(reply, judged)
    assert at is not None and reply[:at + 1] == judged  # the caller's words tokenize alike with their "?"
    ends = sentence_end_tokens(tokenizer)
    alone = Sequence(judged, SamplingParams(max_tokens=1, probe_tokens=ends))
    expected = run(engine, alone)[alone.request_id][0].probe
    plain = Sequence(reply, SamplingParams(max_tokens=6, ignore_eos=True))
    riding = Sequence(reply, probe_params(tokenizer, SamplingParams(max_tokens=6, ignore_eos=True), at))
    out = run(engine, riding, plain)  # batched with another request, after the judge's pages were cached
    probes = [o.probe for o in out[riding.request_id]]
    assert probes[0] == pytest.approx(expected, rel=1e-4, abs=1e-6) and 0.0 < expected < 1.0
    assert probes[1:] == [None] * (len(probes) - 1)  # read once, with the first token
    tokens = [o.token_id for o in out[riding.request_id] if o.token_id is not None]
    assert tokens == [o.token_id for o in out[plain.request_id] if o.token_id is not None]  # the reply is unchanged


def test_words_whose_tokens_change_without_their_punctuation_get_a_request_of_their_own(tiny_llm):
    _, tokenizer = tiny_llm
    reply, judged = prompts(tokenizer, "What is the capital of France?")
    assert probe_position(reply[:len(judged) - 1] + [reply[len(judged) - 1] + 1] + reply[len(judged):], judged) is None
    assert probe_position(reply, None) is None


def test_a_probe_position_outside_the_prompt_is_refused():
    from scheduler.request import check_request

    with pytest.raises(ValueError, match="probe_at"):
        check_request([1, 2, 3], SamplingParams(probe_tokens=(2,), probe_at=3))
    with pytest.raises(ValueError, match="probe_at"):
        check_request([1, 2, 3], SamplingParams(probe_at=1))
