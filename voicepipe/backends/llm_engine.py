"""The LLM backend on the mini-O4 engine: the default backend, sharing the device with every other call."""

from collections.abc import AsyncIterator

from scheduler import Engine, RequestClass, SamplingParams
from scheduler.channel.local import LocalEngine
from voicepipe.backends.base import GenerationParams, chat_prompt_ids


class EngineLLM:
    """The engine on a thread of this process: one-shot commands hold no server beside it."""

    def __init__(self, engine: Engine, cls: RequestClass = RequestClass.INTERACTIVE):
        self.tokenizer, self.cls = engine.tokenizer, cls
        self.engine = LocalEngine(engine)
        self.engine.start()

    async def stream(self, messages: list[dict[str, str]], params: GenerationParams,
                     deadline: float | None = None, session: str | None = None) -> AsyncIterator[str]:
        ids = chat_prompt_ids(self.tokenizer, messages)
        sampling = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                                  top_p=params.top_p, stop=tuple(params.stop))
        async for out in self.engine.generate(ids, sampling, self.cls, deadline, session):
            if out.finish_reason and out.finish_reason.startswith("error"):
                raise RuntimeError(out.finish_reason)
            if out.text:
                yield out.text
