"""The transformers `generate` backend: the correctness oracle and the static-batching baseline.

It streams with `generate` in a worker thread feeding an `AsyncTextIteratorStreamer`, rather than
generating the whole answer first, so a turn can send its first sentence to TTS while the rest is still
being written and time to first token is measured as a user would feel it.
"""

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import torch
from transformers import AsyncTextIteratorStreamer, StoppingCriteria, StoppingCriteriaList

from scheduler.detokenizer import StopScanner
from voicepipe.backends.base import GenerationParams, chat_prompt_ids


class _Cancelled(StoppingCriteria):
    """Ends generation early once the consumer stops reading (stop string, barge-in, closed stream)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


class HFLLM:
    """A causal LM and its tokenizer behind the `LLM` interface, run by transformers' own `generate`."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate_ids(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation of one unpadded prompt: the new token ids only.

        Generation stops after the first end-of-sequence token, which is kept as the last id, so a
        result shorter than `max_tokens` ends with EOS and one of `max_tokens` ids may not.
        """
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad():
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                      max_new_tokens=max_tokens, do_sample=False, pad_token_id=self.pad_id)
        return out[0, len(prompt_ids):].tolist()

    async def stream(self, messages: list[dict[str, str]], params: GenerationParams) -> AsyncIterator[str]:
        """Yield the answer as text deltas, cut before the first stop string if one appears."""
        input_ids = torch.tensor([chat_prompt_ids(self.tokenizer, messages)], dtype=torch.long)
        streamer = AsyncTextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        cancel = threading.Event()
        failure: list[BaseException] = []
        kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                      max_new_tokens=params.max_tokens, streamer=streamer, pad_token_id=self.pad_id,
                      stopping_criteria=StoppingCriteriaList([_Cancelled(cancel)]), **_sampling(params))

        def run() -> None:
            try:
                with torch.no_grad():
                    self.model.generate(**kwargs)
            except BaseException as e:  # re-raised by the consumer; the stream must end either way
                failure.append(e)
                streamer.end()

        worker = threading.Thread(target=run, name="hf-generate", daemon=True)
        worker.start()
        stops = StopScanner(params.stop)
        try:
            async for delta in streamer:
                text = stops.feed(delta)
                if text:
                    yield text
                if stops.stopped:
                    break
            tail = stops.flush()
            if tail:
                yield tail
        finally:
            cancel.set()
            await asyncio.to_thread(worker.join)
        if failure:
            raise failure[0]


def _sampling(params: GenerationParams) -> dict[str, Any]:
    """Greedy at temperature 0; otherwise plain temperature and nucleus sampling, with no top-k cut."""
    if params.temperature <= 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
