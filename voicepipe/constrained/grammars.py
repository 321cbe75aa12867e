"""A request's grammars compiled before it is admitted, each refusal naming the field it came from: the
request waits for the engine's compile worker without a place among the engine's requests, and a
grammar past the compile budget is a clear 400 (or error event), not a reply that never starts."""

import asyncio

from scheduler.grammar.constraint import Grammar, GrammarRefused


class FieldRefused(ValueError):
    """The engine would not compile the grammar of `param`: `code` says why in a word, the message in full."""

    def __init__(self, param: str, refused: GrammarRefused) -> None:
        super().__init__(f"{param}: {refused.reason}")
        self.param, self.code = param, refused.code


async def prepare(engine, grammars: list[tuple[str, Grammar]]) -> None:
    """Compile every (field, grammar) in the engine at once; FieldRefused for the first, in order, that it
    refuses."""
    results = await asyncio.gather(*(engine.prepare_grammar(grammar) for _, grammar in grammars),
                                   return_exceptions=True)
    for (param, _), result in zip(grammars, results, strict=True):
        if isinstance(result, GrammarRefused):
            raise FieldRefused(param, result)
        if isinstance(result, BaseException):
            raise result
