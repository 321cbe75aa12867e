"""A reply's calls to tools the server runs (on MCP servers): run once the reply has written them (and, for
a reply begun ahead of the caller, once the turn is confirmed), their results put in the conversation, and
the caller kept company meanwhile. Each tool's time is learnt across every call of the server; the filler
is decided when the model starts writing the call (its name is known then), so it can begin while the
call's arguments are still being written.

The filler is one of the session's set phrases, not the model's words: the default model, asked for a few
words while a tool ran, talked about "a function called weather" or apologised for errors (`bench tools`,
docs/protocol.md), and a set phrase needs no model step, so it is heard at once.

A barge-in cancels the reply; its calls still running are cancelled with it, or, where the session says
`interrupt_tool_calls: false`, left to finish and handed to the LLM stage, which answers with their results
in a reply of their own when they land (`Carried`)."""

import asyncio
import time
from collections.abc import Callable, Iterator

from voicepipe.constrained.tools import FunctionCall
from voicepipe.ids import new_id
from voicepipe.mcp_servers.toolbox import Toolbox, ToolResult
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.events import Event, FunctionCallDone, FunctionCallStarted, TextDelta, ToolRan
from voicepipe.pipeline.reply_writer import ReplyWriter
from voicepipe.pipeline.tool_wait import ANSWER_S, ToolWait
from voicepipe.pipeline.turn import Carried, Reply, Turn

SPECULATION_POLL_S = 0.02


class ServerCalls:
    """One reply's calls to the server's tools, and the filler while they run."""

    def __init__(self, writer: ReplyWriter, toolbox: Toolbox, config: CallConfig, emit: Callable[[Event], None],
                 spawn: Callable, turn: Turn, reply: Reply, phrases: Iterator[str]) -> None:
        self.writer, self.toolbox, self.config, self.emit, self.spawn = writer, toolbox, config, emit, spawn
        self.turn, self.reply = turn, reply
        self.waits = ToolWait(toolbox.policy.times)  # the server's tools' times, learnt across calls
        self._filler: asyncio.Task | None = None
        self._primed: asyncio.Task | None = None
        self._speaking = asyncio.Event()
        self._phrases = phrases  # the call's filler phrases, in turn
        self._running: dict[str, asyncio.Task[ToolResult]] = {}  # the calls being run, by item id
        self._carried: Carried | None = None  # the call this reply was begun to answer, if any

    def calling(self, call: FunctionCall) -> None:
        """The model began writing `call`: the answer's prompt (the tools' descriptions left out) is computed
        meanwhile, and the filler begins at once if the tool is known to keep the caller waiting past the
        answer's deadline (else `run` decides, when it is known how long writing the call took)."""
        if not call.server:
            return
        if self._primed is None:
            self._primed = self.spawn(self.writer.prefill(self.answer_prompt()))
        expected = self.waits.expected_s.get(self.toolbox.timing_key(call))
        if expected is not None and expected > self.turn.deadline - time.monotonic() - ANSWER_S:
            self._company(0.0)

    def answer_prompt(self, late: Carried | None = None) -> list[int]:
        """The prompt of the answer after the tools' results: without the tools' descriptions, as no call may
        follow (with them, the default model answered 1 of 3 results in words, talking about "this function"
        in the others; without, 3 of 3; the cost is the prefix cache, as the system message changes).

        The answer to a `late` call's result reads the question it was made for and the result alone: the
        conversation went on meanwhile, and with all of it (or with a note asking for the earlier answer)
        the default model answered the caller's newer words again in 3 of 3 tries."""
        conversation = self.writer.conversation
        if late is None or late.question is None:
            return conversation.prompt_ids(self.config.max_prompt_tokens, tool_instructions="")
        result = self.reply.results[self.reply.calls[-1][0]]
        return conversation.prompt_of([{"role": "user", "content": late.question},
                                       {"role": "tool", "content": result.text}], tool_instructions="")

    def _company(self, delay: float) -> None:
        if self._filler is None and self.turn.spoken and self.config.fillers:
            self._filler = self.spawn(self._fill(delay))

    async def run(self) -> bool:
        """Run the reply's calls that have not run (and need no approval): False if there were none. A filler
        that began is let finish (the answer follows it); one not begun is dropped."""
        turn, reply = self.turn, self.reply
        due = [(item_id, call) for item_id, call in reply.calls
               if call.server and item_id not in reply.results and item_id not in reply.awaiting]
        if not due:
            self._drop_filler()
            return False
        while turn.speculative and not turn.cancelled:  # nothing runs for words the caller may not say
            await asyncio.sleep(SPECULATION_POLL_S)
        delay = self.waits.called(tuple(self.toolbox.timing_key(call) for _, call in due), time.monotonic(),
                                  self.turn.deadline)
        self._company(delay)
        self._running = {item_id: self.spawn(self.toolbox.run(call)) for item_id, call in due}  # side by side
        for item_id, call in due:
            self._ran(item_id, call, await self._landed(item_id))
        self.waits.answered(time.monotonic())
        if self._speaking.is_set():
            await self._filler
        self._drop_filler()
        return True

    def interrupted(self, keep: bool) -> list[Carried]:
        """The reply was cancelled: its calls still running are cancelled too, or (`keep`) returned, to be
        answered when they land, with those that ran but whose answer the caller spoke over."""
        running, self._running = self._running, {}
        for task in (self._filler, self._primed):  # a filler not yet said is not said for a cancelled reply
            if task is not None:
                task.cancel()
        if not keep:
            for task in running.values():
                task.cancel()
            return []
        calls = dict(self.reply.calls)
        asked = self.writer.conversation.get(self.turn.item_id) if self.turn.item_id is not None else None
        # A reply begun to answer a carried call answers the question that call was made for.
        question = asked["content"] if asked is not None else self._carried and self._carried.question
        request_id = self._carried and self._carried.approval_request_id
        ran = [Carried(calls[item_id], request_id, result=result, question=question)
               for item_id, result in self.reply.results.items()]
        return [*ran, *(Carried(calls[item_id], request_id, running=task, question=question)
                        for item_id, task in running.items())]

    async def carry(self, carried: Carried) -> None:
        """Run an approved call (or tell the model it was declined), or wait out one an interrupted reply left
        running; its item and result are this reply's."""
        call, self._carried = carried.call, carried
        if not carried.approve:
            self.writer.conversation.add("tool", f"The caller declined the call to {call.name}; it did not run.")
            return
        item_id = new_id("item")
        self.reply.calls.append((item_id, call))
        if carried.approval_request_id is not None:
            self.reply.approved[item_id] = carried.approval_request_id
        self.emit(FunctionCallStarted(self.turn, item_id, call))
        self.emit(FunctionCallDone(self.turn, item_id, call))
        if carried.result is not None:  # spoken over: the conversation has it from the reply it was made for
            self.reply.results[item_id] = carried.result
            self.emit(ToolRan(self.turn, item_id, call, carried.result, carried.approval_request_id))
            return
        self._running[item_id] = carried.running or self.spawn(self.toolbox.run(call))
        self._ran(item_id, call, await self._landed(item_id), carried.approval_request_id)

    async def _landed(self, item_id: str) -> ToolResult:
        """The result of the call being run for `item_id`. Shielded: a barge-in cancels the reply, and
        `interrupted` decides whether the call goes on."""
        result = await asyncio.shield(self._running[item_id])
        del self._running[item_id]
        return result

    def space(self) -> None:
        """A space between what the reply said and what it says next, after a pause for a tool."""
        if self.reply.text and not self.reply.text[-1].isspace():
            self.reply.text += " "
            self.emit(TextDelta(self.turn, " "))

    def _ran(self, item_id: str, call: FunctionCall, result: ToolResult, approval_request_id: str | None = None
             ) -> None:
        self.reply.results[item_id] = result
        self.writer.conversation.add("tool", result.text)
        self.emit(ToolRan(self.turn, item_id, call, result, approval_request_id))

    async def _fill(self, delay: float) -> None:
        """A set phrase, unless the result came first (the call may still be being written)."""
        await asyncio.sleep(delay)
        self._speaking.set()
        self.space()
        phrase = next(self._phrases)
        self.reply.text += phrase
        self.emit(TextDelta(self.turn, phrase))
        self.space()  # its sentence is complete: it is spoken now, not with the answer

    def _drop_filler(self) -> None:
        if self._filler is not None and not self._speaking.is_set():
            self._filler.cancel()
