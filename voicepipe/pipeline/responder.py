"""The reply in progress, one at a time: begun, paced by the TTS stage, cancelled. Its stream runs in a task
the LLM stage owns (`ReplyWriter` writes it); the LLM stage decides which reply to begin and when. A reply
that calls tools the server runs (on MCP servers, `ServerCalls`) runs them and goes on, in the same
response, once their results are in the conversation; a barge-in cancels them with the reply, or leaves
them running for the LLM stage to answer with when they land (`ServerCalls.interrupted`)."""

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from voicepipe.constrained.tools import FunctionCall
from voicepipe.ids import new_id
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.engine_port import Engine
from voicepipe.pipeline.events import Paced, ResponseCreated, TextDone, TranscriptEarly, TurnCancelled
from voicepipe.pipeline.items import Items
from voicepipe.pipeline.reply_writer import ReplyRequest, ReplyWriter
from voicepipe.pipeline.server_calls import ServerCalls
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Carried, Mark, Reply, Turn
from voicepipe.pipeline.verdicts import Probed


class Responder:
    """Holds `turn` (the latest reply) and what was written for it; `called_for` is the end of the caller's
    speech that a reply ending in a function call answered, so the reply after the call's output is timed
    from it, as the same turn."""

    def __init__(self, stage: Stage, engine: Engine, writer: ReplyWriter, items: Items, config: CallConfig,
                 call_id: str, on_calls: Callable[[Turn, tuple[str, ...]], None], fillers: Iterator[str],
                 on_left_running: Callable[[list[Carried]], None]) -> None:
        self.stage, self.engine, self.writer, self.items = stage, engine, writer, items
        self.on_calls = on_calls  # a reply ended calling these functions: the client runs them now
        self.on_left_running = on_left_running  # a barge-in left these server calls running
        self.fillers = fillers  # the set phrases said while the server's tools run, in turn across replies
        self.config, self.call_id = config, call_id
        self.turn: Turn | None = None
        self.written = Reply()  # what the LLM wrote for `turn`
        self.called_for: float | None = None
        self._due: float | None = None  # when `turn`'s request must deliver, as the TTS stage last said
        self._task: asyncio.Task | None = None
        self._calls: ServerCalls | None = None  # the server's calls of `turn`'s reply
        self.approvals: dict[str, FunctionCall] = {}  # calls waiting for the client's approval, by request id

    @property
    def answering(self) -> bool:
        """A reply to the conversation is being written (not one begun ahead of the caller)."""
        return self.turn is not None and self.turn.active and not self.turn.speculative

    @property
    def speculating(self) -> bool:
        return self.turn is not None and self.turn.active and self.turn.speculative

    def new_turn(self, item_id: str | None, speech_end: float, spoken: bool, speculative: bool = False) -> Turn:
        response_id = new_id("resp")
        turn = Turn(response_id, f"{self.call_id}-{response_id}", item_id, speech_end,
                    speech_end + self.config.ttfa_s, spoken, speculative)
        self.items.heard.add(turn)
        return turn

    def begin(self, turn: Turn, request: ReplyRequest, metadata: dict[str, str] | None = None,
              out_of_band: bool = False, early: TranscriptEarly | None = None) -> None:
        """Stream `turn`'s reply; with `early` (a reply begun at that pause), what its prefill read of the end
        of the caller's turn goes up to turn-taking."""
        self.turn, self.written, self._due = turn, Reply(prompt_tokens=len(request.prompt)), None
        self._calls = None  # the previous reply's, until this one's task makes its own
        turn.mark(Mark.REPLY_STARTED)  # before the end of speech (a negative time) when speculative
        # Here, not in the task: a cancel may come before the task runs.
        self.stage.emit(ResponseCreated(turn, turn.speculative, metadata, out_of_band))
        self._task = self.stage.spawn(self._respond(turn, self.written, request, early))

    def cancel(self, reason: str) -> None:
        """Cancel the turn in progress, if any: its request is aborted as its stream closes."""
        turn = self.turn
        if turn is None or not turn.active:
            return
        turn.cancelled = True
        if self._task is not None:
            self._task.cancel()
        if self._calls is not None:
            keep = reason == "barge_in" and not self.config.interrupt_tool_calls
            left = self._calls.interrupted(keep)
            if left:
                self.on_left_running(left)
        if not turn.speculative:  # a speculative turn is not in the conversation, nor heard
            self.items.cut(turn, time.monotonic())
        self.stage.emit(TurnCancelled(turn, reason, self.written.copy()))

    def paced(self, event: Paced) -> None:
        """The TTS stage's new deadline for the turn's request (this stage alone moves it)."""
        turn = event.turn
        if turn is self.turn and not (self.written.done or turn.cancelled):
            self._due = event.due
            self.engine.set_deadline(turn.request_id, event.due)

    async def _respond(self, turn: Turn, reply: Reply, request: ReplyRequest, early: TranscriptEarly | None) -> None:
        # The TTS stage's pacing of this turn, if it came before the request (else the turn's own deadline).
        deadline = turn.deadline if self._due is None else self._due

        def probed(probability: float) -> None:
            if early is not None:
                self.stage.emit_upstream(Probed(early, probability))

        def called() -> None:
            self.called_for = turn.speech_end

        calls = self._calls = None if self.writer.toolbox is None else ServerCalls(
            self.writer, self.writer.toolbox, self.config, self.stage.emit, self.stage.spawn, turn, reply, self.fillers)
        if request.carried is not None and calls is not None:
            await calls.carry(request.carried)
            request = replace(request, prompt=calls.answer_prompt(request.carried), carried=None, after_calls=True)
        await self.writer.write(turn, reply, request, deadline, probed, called, calls and calls.calling)
        # The server's calls run, and the reply goes on after their results (in words: one round of calls).
        if calls is not None and await calls.run() and not reply.awaiting and request.in_conversation:
            calls.space()
            # The model reads what it said so far (a filler) before its calls and their results, and goes on.
            self.writer.conversation.set_reply(turn.output_item_id, reply.text)
            request = replace(request, prompt=calls.answer_prompt(), probe_at=None, after_calls=True)
            await self.writer.write(turn, reply, request, self._due or deadline, probed, called)
        self.approvals.update((item_id, call) for item_id, call in reply.calls if item_id in reply.awaiting)
        reply.done = True
        turn.mark(Mark.TEXT_DONE)
        if not turn.spoken:  # no first audio will say the caller was answered
            self.engine.expect(self.call_id, None)
        self.writer.conversation.set_reply(turn.output_item_id, reply.text)
        self.stage.emit(TextDone(turn, reply.copy()))
        client_calls = tuple(call.name for _, call in reply.calls if not call.server)
        if client_calls and not turn.cancelled:
            self.on_calls(turn, client_calls)
