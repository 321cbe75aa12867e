"""Has the caller finished? The LLM's own answer: its probability of the end-of-message token after the
words heard so far, read from a one-token request over the conversation (whose prefix is in the KV cache,
so only the new message is computed). Measured against Smart Turn, an audio model, by `bench turns`.

A backchannel ("mm-hm", "yeah") or a cough said over the assistant is not a turn: `is_backchannel` tells.
"""

import re
from contextlib import aclosing
from typing import Any

from scheduler import RequestClass, SamplingParams
from scheduler.client import EngineClient

BACKCHANNELS = {"mm", "mmm", "hm", "hmm", "mhm", "mm-hmm", "mm-hm", "mmhmm", "uh-huh", "uh", "um", "ah", "oh",
                "yeah", "yes", "yep", "ok", "okay", "right", "sure", "aha", "huh", "i", "see", "got", "it"}
_NOISE = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's "(coughs)", "[noise]", "*sigh*"


def is_backchannel(text: str) -> bool:
    """Nothing but a short acknowledgement, a filler or a noise: no reason to stop the assistant."""
    words = re.findall(r"[a-z]+(?:[-'][a-z]+)*", _NOISE.sub(" ", text.lower()))
    return len(words) <= 3 and all(word in BACKCHANNELS for word in words)


def judge_prompt(prompt_ids: list[int], end_token: int) -> list[int] | None:
    """A reply's prompt cut just before the end-of-message token that closes the caller's message (the
    last one in it: only the assistant's opener follows); None when the template has no such token."""
    for i in range(len(prompt_ids) - 1, 0, -1):
        if prompt_ids[i] == end_token:
            return prompt_ids[:i]
    return None


async def end_probability(engine: EngineClient, tokenizer: Any, prompt_ids: list[int], deadline: float) -> float | None:
    """The model's probability that the last message of `prompt_ids` (a reply's prompt) is finished."""
    end = tokenizer.eos_token_id
    judged = judge_prompt(prompt_ids, end) if end is not None else None
    if judged is None:
        return None
    params = SamplingParams(max_tokens=1, probe_token=end)
    probability = None
    stream = engine.generate(judged, params, cls=RequestClass.REALTIME, deadline=deadline)
    async with aclosing(stream) as outputs:
        async for out in outputs:
            if out.probe is not None:
                probability = out.probe
    return probability
