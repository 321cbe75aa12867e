"""The LLM backend on the mini-O4 engine: the default backend, sharing the device with every other call."""

from collections.abc import AsyncIterator

from scheduler import Engine, RequestClass, SamplingParams
from voicepipe.backends.base import GenerationParams, chat_prompt_ids


class EngineLLM:
    def __init__(self, engine: Engine, cls: RequestClass = RequestClass.INTERACTIVE):
        self.engine, self.cls = engine, cls
        engine.start()

    async def stream(self, messages: list[dict[str, str]], params: GenerationParams,
                     deadline: float | None = None, session: str | None = None) -> AsyncIterator[str]:
        ids = chat_prompt_ids(self.engine.tokenizer, messages)
        sampling = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                  top_p=params.top_p, stop=tuple(params.stop))
        async for out in self.engine.generate(ids, sampling, self.cls, deadline, session):
            if out.finish_reason and out.finish_reason.startswith("error"):
                raise RuntimeError(out.finish_reason)
            if out.text:
                yield out.text
