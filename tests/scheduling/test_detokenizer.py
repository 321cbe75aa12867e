"""Streaming text out of token ids: the deltas add up to the whole decode, cut at stop strings."""

import pytest

from scheduler.detokenizer import Detokenizer, StopScanner

TEXTS = [
    "Paris is the capital of France.",
    "Café crème, naïve façade — déjà vu!",
    "Emoji 🙂👍 and 漢字 in one line.",
    "  leading spaces\n\nand new lines\tand tabs  ",
]


def stream(detokenizer: Detokenizer, ids: list[int]) -> list[str]:
    return [detokenizer.add(i) for i in ids] + [detokenizer.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_whole_decode(llm, text):
    _, tokenizer = llm
    ids = tokenizer.encode(text)
    detokenizer = Detokenizer(tokenizer)
    deltas = stream(detokenizer, ids)
    assert "".join(deltas) == detokenizer.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any(d.endswith("\ufffd") for d in deltas)  # never half a character


def test_special_tokens_are_not_shown(llm):
    _, tokenizer = llm
    ids = tokenizer.encode("Hello there.") + [tokenizer.eos_token_id]
    assert "".join(stream(Detokenizer(tokenizer), ids)) == "Hello there."


def test_output_is_cut_before_the_first_stop_string(llm):
    _, tokenizer = llm
    detokenizer = Detokenizer(tokenizer, ["capital"])
    shown = "".join(stream(detokenizer, tokenizer.encode("Paris is the capital of France.")))
    assert shown == "Paris is the " and detokenizer.stopped


def test_stop_scanner_catches_a_stop_split_over_deltas():
    scanner = StopScanner(["</end>"])
    emitted = [scanner.feed(d) for d in ["Hello <", "/e", "nd> never"]]
    assert "".join(emitted) == "Hello " and scanner.stopped
    plain = StopScanner(["</end>"])
    assert plain.feed("a <b") + plain.flush() == "a <b" and not plain.stopped
