"""One reply streamed from the engine: its text goes on to be spoken, a function call becomes an item of its
own, never spoken (and, out of band, never part of the conversation): a call the client runs, one the server
runs on an MCP server, or one that waits for the client's approval first."""

from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from scheduler import RequestClass, SamplingParams
from scheduler.grammar.constraint import Grammar
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.constrained import tools
from voicepipe.constrained.tools import FunctionCall
from voicepipe.ids import new_id
from voicepipe.mcp_servers.toolbox import Toolbox
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.end_of_turn import probe_params
from voicepipe.pipeline.engine_port import Engine
from voicepipe.pipeline.events import (
    ApprovalRequested,
    Error,
    Event,
    FunctionCallArguments,
    FunctionCallDone,
    FunctionCallStarted,
    TextDelta,
)
from voicepipe.pipeline.turn import Carried, Mark, Reply, Turn

# Plain words: no markup, so nothing a call or JSON could be written with (unbounded: a bound on the
# repetition took the compiler past its budget; the reply's token limit bounds it instead).
WORDS = Grammar("regex", r"[^<>{}\[\]]+")


@dataclass(frozen=True, slots=True)
class ReplyRequest:
    """What to ask the engine for one turn: its prompt, the KV session it extends (None: out of band or
    ahead of the caller), and at which prompt position its prefill reads the end-of-turn probability."""

    prompt: list[int]
    session: str | None
    max_tokens: int
    in_conversation: bool = True
    probe_at: int | None = None
    tools: tuple[tuple[Any, ...], str | None] | None = None  # (tools, choice) for this reply; None: the session's
    words_only: bool = False
    # A call run (or waited out) before the reply is written: one the client has just approved or declined,
    # or one a barge-in left running or spoke over.
    carried: Carried | None = None
    after_calls: bool = False  # the answer after its calls' results: in plain words (no call after a call)
    say: str | None = None  # the reply's words, given: nothing is asked of the engine


class ReplyWriter:
    """Streams a turn's reply into its `Reply` record, emitting what the client hears of it as it comes."""

    def __init__(self, engine: Engine, tokenizer: Any, conversation: Conversation, config: CallConfig,
                 emit: Callable[[Event], None], toolbox: Toolbox | None = None) -> None:
        self.engine, self.tokenizer, self.conversation, self.config = engine, tokenizer, conversation, config
        self.emit, self.toolbox = emit, toolbox

    async def write(self, turn: Turn, reply: Reply, request: ReplyRequest, deadline: float,
                    probed: Callable[[float], None], called: Callable[[], None],
                    calling: Callable[[FunctionCall], None] | None = None) -> None:
        """The stream of `turn`'s request until it ends; `probed` hears the end-of-turn probability its
        prefill read, `called` each call of the client's it completes, `calling` each call it begins."""
        if request.say is not None:
            self._said(turn, reply, [("text", request.say)], request.in_conversation, called, calling)
            return
        offered = self.config.offered
        callable_, choice = request.tools or (offered, tools.choose(list(offered), self.config.tool_choice))
        # With tools and none to call ("none"), the model still copied the call format from the conversation
        # into words the caller would hear: such a reply is held to plain words too.
        # After a call's result too: the default model, free to call again, wrote the call format as words.
        plain = request.words_only or request.after_calls or (bool(callable_) and choice is None)
        grammar = WORDS if plain else tools.grammar(list(callable_), choice) if choice else None
        params = SamplingParams(max_tokens=request.max_tokens, temperature=self.config.temperature, grammar=grammar)
        if request.probe_at is not None:
            params = probe_params(self.tokenizer, params, request.probe_at)
        parser = tools.FunctionCallParser({t.name: t.server for t in callable_ if t.server}) if choice else None
        stream = self.engine.generate(request.prompt, params, cls=RequestClass.REALTIME, deadline=deadline,
                                      session=request.session, request_id=turn.request_id)
        async with aclosing(stream) as outputs:
            async for out in outputs:
                if out.probe is not None:
                    probed(out.probe)
                if out.cached is not None and not reply.output_tokens:
                    reply.cached_tokens = out.cached
                if out.token_id is not None:
                    turn.mark(Mark.FIRST_TOKEN)
                    reply.output_tokens += 1
                if out.text or out.finished:
                    pieces = [("text", out.text)] if parser is None else parser.feed(out.text)
                    if parser is not None and out.finished:
                        pieces += parser.flush()
                    self._said(turn, reply, pieces, request.in_conversation, called, calling)
                if out.finished and (out.finish_reason or "").startswith("error"):
                    self.emit(Error("generation_failed", out.finish_reason or "", "server_error"))

    async def prime(self, session: str) -> None:
        """Prefill the instructions while the caller speaks their first words: they stay in the KV cache
        as the call's prefix, so the first turn computes only the caller's message."""
        if not (self.conversation.instructions or self.conversation.tool_instructions):
            return
        await self.prefill(chat_prompt_ids(self.tokenizer, self.conversation.messages()[:1]), session)

    async def prefill(self, prompt: list[int], session: str | None = None) -> None:
        """Compute `prompt` into the KV cache ahead of a reply that will begin with it."""
        stream = self.engine.generate(prompt, SamplingParams(max_tokens=1), cls=RequestClass.INTERACTIVE,
                                      session=session)
        async with aclosing(stream) as outputs:
            async for _ in outputs:
                pass

    def _said(self, turn: Turn, reply: Reply, pieces: list[tuple[str, Any]], in_conversation: bool,
              called: Callable[[], None], calling: Callable[[FunctionCall], None] | None) -> None:
        for kind, value in pieces:
            if kind == "text" and value:
                reply.text += value
                self.emit(TextDelta(turn, value))
            elif kind == "start":
                reply.calls.append((new_id("item"), value))
                if self._needs_approval(value):
                    reply.awaiting.add(reply.calls[-1][0])  # its request is all the client sees of it
                else:
                    self.emit(FunctionCallStarted(turn, reply.calls[-1][0], value))
                    if calling is not None:
                        calling(value)
            elif kind == "arguments":
                item_id, call = reply.calls[-1]
                if item_id not in reply.awaiting:
                    self.emit(FunctionCallArguments(turn, item_id, call.call_id, value, call.server))
            elif kind == "end":
                item_id = reply.calls[-1][0]
                reply.calls[-1] = (item_id, value)
                if in_conversation and not turn.speculative:  # a speculative turn's join it if it is confirmed
                    self.conversation.add("assistant", tools.call_text(value.name, value.arguments), item_id)
                if not value.server:
                    called()
                self.emit(ApprovalRequested(turn, item_id, value) if item_id in reply.awaiting
                          else FunctionCallDone(turn, item_id, value))

    def _needs_approval(self, call: FunctionCall) -> bool:
        return bool(call.server) and self.toolbox is not None and self.toolbox.needs_approval(call)
