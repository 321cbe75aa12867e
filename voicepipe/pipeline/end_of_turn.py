"""Has the caller finished? The LLM's own answer: the probability that the words heard so far are followed
by a sentence's final punctuation or the end of the message. It is read in the speculative reply's own
prefill, at the position of the caller's last word (`probe_position`): a pause costs one request. Where
that reply does not run (no speculation, words said over the assistant) or the prompts do not line up, a
one-token request over the conversation asks it instead (its prefix is in the KV cache, so only the new
message is computed).

The transcript's own final punctuation is taken off first: Whisper ends a fragment with "?" as readily as a
question ("What is the capital of?"), so it says nothing about the words, while the model's expectation of
what comes next does ("...of" wants a noun; "...of France" a "?"). `bench turns` measures this against the
transcript as heard and against Smart Turn, an audio model (docs/performance.md, "Turn-taking, measured").

A backchannel ("mm-hm", "yeah") or a cough said over the assistant is not a turn: `is_backchannel` tells.
"""

import functools
import re
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scheduler import RequestClass, SamplingParams
from voicepipe.pipeline.engine_port import Engine

if TYPE_CHECKING:
    from voicepipe.pipeline.conversation import Conversation

# Words of backchannels and fillers, hyphenated ones by their parts ("mm-hmm", "uh-huh", "uh-uh"). A thanks
# said over the reply lets it go on too; it is also what Whisper makes of a burst of noise ("Thank you.",
# "you"), which on a speakerphone is the echo's residue at a reply's start.
BACKCHANNELS = {"mm", "mmm", "hm", "hmm", "mhm", "mmhmm", "uh", "um", "ah", "oh", "huh", "aha", "yeah", "yes",
                "yep", "ok", "okay", "right", "sure", "i", "see", "got", "it", "thanks", "thank", "you"}
_NOISE = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's "(coughs)", "[noise]", "*sigh*"


def is_backchannel(text: str) -> bool:
    """Nothing but a short acknowledgement, a filler or a noise: no reason to stop the assistant."""
    words = re.findall(r"[a-z]+", _NOISE.sub(" ", text.lower()))
    return len(words) <= 4 and all(word in BACKCHANNELS for word in words)


FINAL_PUNCTUATION = "?.!"


@functools.cache
def sentence_end_tokens(tokenizer: Any) -> tuple[int, ...]:
    """The end-of-message token and every token that is only final punctuation ("?", ".", "...", "!\"")."""
    ends = {tokenizer.eos_token_id}
    for token, token_id in tokenizer.get_vocab().items():
        text = token.lstrip("Ġ▁ ")
        if text and text[0] in FINAL_PUNCTUATION and not any(c.isalnum() for c in text):
            ends.add(token_id)
    return tuple(sorted(ends))


def unpunctuated(text: str) -> str:
    return text.strip().rstrip(FINAL_PUNCTUATION + ",;:… ")


def judge_prompt(prompt_ids: list[int], end_token: int) -> list[int] | None:
    """A reply's prompt cut just before the end-of-message token that closes the caller's message (the
    last one in it: only the assistant's opener follows); None when the template has no such token."""
    for i in range(len(prompt_ids) - 1, 0, -1):
        if prompt_ids[i] == end_token:
            return prompt_ids[:i]
    return None


def judged_prompt(tokenizer: Any, prompt_ids: list[int]) -> list[int] | None:
    """What the judge reads of a reply's prompt (its last message `unpunctuated`): all of it up to the
    caller's last word; None when the chat template has no end token to cut at."""
    end = tokenizer.eos_token_id
    return judge_prompt(prompt_ids, end) if end is not None else None


def probe_position(reply_prompt: list[int], judged: list[int] | None) -> int | None:
    """Where a reply's own prefill can answer the judge: the judge's last position, when the judge's
    prompt is a prefix of the reply's (the caller's words tokenize the same with and without their final
    punctuation, as they do under byte-pair tokenizers that split punctuation off); None otherwise."""
    if judged is None or len(judged) > len(reply_prompt) or reply_prompt[:len(judged)] != judged:
        return None
    return len(judged) - 1


def judged_ids(conversation: "Conversation", max_prompt_tokens: int, words: str) -> list[int]:
    """The conversation with the words at a pause, unpunctuated, as the judge reads them."""
    return conversation.prompt_ids(max_prompt_tokens, ({"role": "user", "content": unpunctuated(words)},))


def probe_position_for(conversation: "Conversation", tokenizer: Any, max_prompt_tokens: int, reply_prompt: list[int],
                       words: str) -> int | None:
    """Where the prefill of a reply to `words` (its prompt `reply_prompt`) reads the judge's answer."""
    return probe_position(reply_prompt, judged_prompt(tokenizer, judged_ids(conversation, max_prompt_tokens, words)))


def probe_params(tokenizer: Any, params: SamplingParams, position: int) -> SamplingParams:
    """`params` that also read the end-of-turn probability at prompt `position`, in the same prefill."""
    return replace(params, probe_tokens=sentence_end_tokens(tokenizer), probe_at=position)


async def end_probability(engine: Engine, tokenizer: Any, prompt_ids: list[int], deadline: float) -> float | None:
    """The model's probability that the last message of `prompt_ids` (a reply's prompt, its last message
    `unpunctuated`) is a finished sentence, as a request of its own; None when the chat template has no
    end token to cut at."""
    judged = judged_prompt(tokenizer, prompt_ids)
    if judged is None:
        return None
    params = SamplingParams(max_tokens=1, probe_tokens=sentence_end_tokens(tokenizer))
    probability = None
    stream = engine.generate(judged, params, cls=RequestClass.REALTIME, deadline=deadline)
    async with aclosing(stream) as outputs:
        async for out in outputs:
            if out.probe is not None:
                probability = out.probe
    return probability
