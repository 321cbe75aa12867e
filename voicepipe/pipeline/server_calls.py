"""A reply's calls to tools the server runs (on MCP servers): run once the reply has written them (and, for
a reply begun ahead of the caller, once the turn is confirmed), their results put in the conversation, and
the caller kept company meanwhile. Each tool's time is learnt across every call of the server; the filler
is decided when the model starts writing the call (its name is known then), so it can begin while the
call's arguments are still being written."""

import asyncio
import time
from collections.abc import Callable

from voicepipe.constrained.tools import FunctionCall
from voicepipe.ids import new_id
from voicepipe.mcp_servers.toolbox import Toolbox, ToolResult
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.events import Event, FunctionCallDone, FunctionCallStarted, TextDelta, ToolRan
from voicepipe.pipeline.idle_reply import FILLER_MESSAGE, FILLER_TOKENS
from voicepipe.pipeline.reply_writer import ReplyRequest, ReplyWriter
from voicepipe.pipeline.tool_wait import ToolWait
from voicepipe.pipeline.turn import Reply, Turn

SPECULATION_POLL_S = 0.02


class ServerCalls:
    """One reply's calls to the server's tools, and the filler while they run."""

    def __init__(self, writer: ReplyWriter, toolbox: Toolbox, config: CallConfig, emit: Callable[[Event], None],
                 spawn: Callable, turn: Turn, reply: Reply) -> None:
        self.writer, self.toolbox, self.config, self.emit, self.spawn = writer, toolbox, config, emit, spawn
        self.turn, self.reply = turn, reply
        self.waits = ToolWait(toolbox.policy.times)  # the server's tools' times, learnt across calls
        self._filler: asyncio.Task | None = None
        self._speaking = asyncio.Event()

    def calling(self, call: FunctionCall) -> None:
        """The model began writing `call`: a filler is due if the tool would keep the caller waiting."""
        if call.server and self._filler is None and self.turn.spoken:
            delay = self.waits.called((self.toolbox.timing_key(call),), time.monotonic(), self.turn.deadline)
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
        if self._filler is None:
            self.calling(due[0][1])
        for item_id, call in due:
            self._ran(item_id, call, await self.toolbox.run(call))
        self.waits.answered(time.monotonic())
        if self._speaking.is_set():
            await self._filler
        self._drop_filler()
        return True

    async def approved(self, request_id: str, call: FunctionCall, approve: bool) -> None:
        """The client answered an approval request: run the call, or tell the model it was declined."""
        if not approve:
            self.writer.conversation.add("tool", f"The caller declined the call to {call.name}; it did not run.")
            return
        item_id = new_id("item")
        self.reply.calls.append((item_id, call))
        self.reply.approved[item_id] = request_id
        self.emit(FunctionCallStarted(self.turn, item_id, call))
        self.emit(FunctionCallDone(self.turn, item_id, call))
        self._ran(item_id, call, await self.toolbox.run(call), request_id)

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
        """A few plain words, from a request of their own (the call may still be being written), unless the
        result came first."""
        await asyncio.sleep(delay)
        self._speaking.set()
        self.space()
        prompt = self.writer.conversation.prompt_ids(self.config.max_prompt_tokens, FILLER_MESSAGE)
        words = ReplyRequest(prompt, None, FILLER_TOKENS, tools=((), None), words_only=True,
                             request_id=f"{self.turn.request_id}-filler")
        await self.writer.write(self.turn, self.reply, words, self.turn.deadline, lambda probability: None,
                                lambda: None)
        self.space()  # its last sentence is complete: it is spoken now, not with the answer

    def _drop_filler(self) -> None:
        if self._filler is not None and not self._speaking.is_set():
            self._filler.cancel()
