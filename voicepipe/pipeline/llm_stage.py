"""The LLM stage: writes the replies turn-taking asks for, and owns the conversation."""

import asyncio
import contextlib
import itertools
import time
from typing import Any

from scheduler import RequestClass
from voicepipe.constrained import tools
from voicepipe.constrained.tools import Tool
from voicepipe.mcp_servers.toolbox import Toolbox
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.end_of_turn import probe_position_for
from voicepipe.pipeline.engine_port import Engine
from voicepipe.pipeline.events import (
    BargeInResolved,
    Error,
    Event,
    Feedback,
    IdleTimedOut,
    InputCleared,
    Paced,
    PlaybackPaused,
    Played,
    ReplyEnded,
    SpeechStarted,
    TranscriptFinal,
    TurnConfirmed,
    UtteranceDropped,
)
from voicepipe.pipeline.idle_reply import filler_reply, idle_reply
from voicepipe.pipeline.items import Items
from voicepipe.pipeline.keypad import Keypad
from voicepipe.pipeline.reply_writer import ReplyRequest, ReplyWriter
from voicepipe.pipeline.requests import (
    ApprovalGiven,
    CancelRequested,
    ItemCreated,
    ItemRequested,
    KeyPressed,
    ResponseRequested,
    SessionUpdate,
    ToolsListed,
    TruncateRequested,
)
from voicepipe.pipeline.responder import Responder
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.tool_wait import ToolWait
from voicepipe.pipeline.turn import Carried, Mark, Turn
from voicepipe.pipeline.verdicts import DropSpeculation, Probed, Speculate, TurnEnded

VERDICTS = TurnEnded | Speculate | DropSpeculation  # turn-taking's, for this stage alone
ACTED_ON = VERDICTS | BargeInResolved | IdleTimedOut  # passed on by their handlers, if at all


class LLMStage(Stage):
    """Each reply is a REALTIME request against the turn's deadline, counted from the caller's last voiced
    frame; it carries the call id as its session, so the conversation stays in the KV cache between turns
    and only new messages are prefilled. A reply begun ahead (`Speculate`) runs outside the conversation
    until the final transcript confirms its words (`TurnEnded`), then joins it; otherwise it is dropped
    before anything of it was sent. What the caller heard of each recent reply is kept (from `Played` and
    `PlaybackPaused`), so a reply cut off keeps only its heard words in the conversation."""

    def __init__(self, engine: Engine, tokenizer: Any, conversation: Conversation, config: CallConfig,
                 call_id: str, toolbox: Toolbox | None = None, function_times: dict[str, float] | None = None
                 ) -> None:
        super().__init__()
        self.engine, self.tokenizer, self.conversation = engine, tokenizer, conversation
        self.config, self.call_id = config, call_id
        self.writer = ReplyWriter(engine, tokenizer, conversation, config, self.emit, toolbox)
        self.items = Items(conversation, self.emit)
        # The client's functions' times, learnt across the server's calls where it shares them.
        self.tool_wait = ToolWait({} if function_times is None else function_times)
        self._phrases = itertools.cycle(config.fillers)
        self.replies = Responder(self, engine, self.writer, self.items, config, call_id, self._calls_made,
                                 self._phrases, self._left_running)
        self._filler: asyncio.Task | None = None  # says a few words if the functions' results are slow
        self._filling: Turn | None = None  # the filler reply, which the answer may cut short
        self._primed = False
        self.keypad = Keypad(self.spawn, self._keyed)
        self._speculated = ""  # the caller's words a reply begun ahead answers
        self._hearing: set[str] = set()  # the caller's utterances begun and not yet transcribed
        self._changed = asyncio.Event()  # an event came or a reply ended: what waits for quiet looks again
        self._handlers = {SpeechStarted: self._speech_started, DropSpeculation: self._drop_speculation,
                          Speculate: self._speculate, TurnEnded: self._turn_ended, BargeInResolved: self._resolved,
                          CancelRequested: self._cancel_requested, TruncateRequested: self.items.truncate,
                          ItemCreated: self._item_created, ResponseRequested: self._response_requested,
                          ItemRequested: lambda event: self.items.requested(event, self._cancel_item),
                          SessionUpdate: self._update, IdleTimedOut: self._idle, ToolsListed: self._listed,
                          ApprovalGiven: self._approval,
                          KeyPressed: lambda event: self.keypad.press(event.digit)}

    @property
    def turn(self) -> Turn | None:
        return self.replies.turn

    async def process(self, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._hearing.add(event.item_id)
        elif isinstance(event, TranscriptFinal | UtteranceDropped | InputCleared):
            self._hearing.discard(event.item_id)
        elif isinstance(event, TurnEnded):  # the caller's turn is over: an utterance never transcribed is too
            self._hearing.clear()
        if not isinstance(event, ACTED_ON):
            self.emit(event)
        if (handle := self._handlers.get(type(event))) is not None:
            handle(event)
        if isinstance(event, BargeInResolved):  # after the cancel it causes, as the output stage expects
            self.emit(event)
        self._changed.set()

    async def feedback(self, event: Feedback) -> bool:
        if isinstance(event, Played):
            if self.items.played(event):  # the turn's first audio is out: the engine need not expect the caller
                self.engine.expect(self.call_id, None)
            return True
        if isinstance(event, Paced):
            self.replies.paced(event)
            return True
        if isinstance(event, ReplyEnded):
            self._changed.set()
            return True
        if isinstance(event, PlaybackPaused):
            self.items.paused(event)
        return False  # PlaybackPaused goes on to turn-taking, which waits for the caller's words

    def cancel(self, reason: str) -> None:
        self.replies.cancel(reason)

    def _update(self, event: SessionUpdate) -> None:
        """The session's new instructions, tools and output, for the replies from now on (an MCP server's
        tools join once it has listed them)."""
        config = self.config
        config.spoken, config.tools, config.tool_choice = event.spoken, event.tools, event.tool_choice
        config.instructions = self.conversation.instructions = event.instructions
        if event.retention is not None:
            config.retention_ratio = self.conversation.retention = event.retention
        if event.interrupt_tool_calls is not None:
            config.interrupt_tool_calls = event.interrupt_tool_calls
        if event.servers is not None:
            config.servers = event.servers
            named = {spec.label for spec in event.servers}
            config.server_tools = tuple(t for t in config.server_tools if t.server in named)
        self._retool()

    def _listed(self, event: ToolsListed) -> None:
        config = self.config
        if any(spec.label == event.label for spec in config.servers):
            config.server_tools = (*(t for t in config.server_tools if t.server != event.label), *event.tools)
            self._retool()

    def _retool(self) -> None:
        """What the system prompt says the model may call: the session's functions and its servers' tools."""
        offered = list(self.config.offered)
        chosen = tools.choose(offered, self.config.tool_choice)
        self.conversation.tool_instructions = tools.instructions(offered, chosen) if chosen else ""

    def _approval(self, event: ApprovalGiven) -> None:
        """The client approved (or declined) a call: it runs, and a reply answers with its result."""
        call = self.replies.approvals.pop(event.request_id, None)
        if call is None:
            self.emit(Error("item_not_found", f"no MCP approval request {event.request_id!r} is waiting"))
            return
        self.emit(ItemCreated(event.item_id, "tool", "", event.item))
        if self.replies.answering:
            self.replies.approvals[event.request_id] = call
            self.emit(Error("conversation_already_has_active_response", "a response is in progress: send the "
                            "approval again once its response.done has come"))
            return
        self._drop_speculation()
        self._reply(None, time.monotonic(), carried=Carried(call, event.request_id, event.approve))

    def _left_running(self, calls: list[Carried]) -> None:
        for carried in calls:
            self.spawn(self._fold_in(carried))

    async def _fold_in(self, carried: Carried) -> None:
        """A call a barge-in left running has landed (or had, its answer spoken over): once the caller is not
        speaking and no reply is under way (their own turn is answered first), a reply of its own shows its
        result and answers with it. An utterance never transcribed holds it up for the longest one at most."""
        if carried.running is not None:
            await asyncio.wait([carried.running])
        heard_for = 0.0  # how long the caller has been speaking meanwhile
        while self.replies.answering or self.replies.speculating or (
                self._hearing and heard_for < self.config.max_utterance_s):
            replying = self.replies.answering or self.replies.speculating
            hearing, since = bool(self._hearing), time.monotonic()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):  # the caller's allowance ran out
                await asyncio.wait_for(self._changed.wait(),
                                       None if replying else self.config.max_utterance_s - heard_for)
            heard_for += time.monotonic() - since if hearing else 0.0
        self._reply(None, time.monotonic(), carried=carried)

    def _speech_started(self, event: SpeechStarted) -> None:
        self.replies.called_for = None
        if not self._primed:
            self._primed = True
            self.spawn(self.writer.prime(self.call_id))

    def _resolved(self, event: BargeInResolved) -> None:
        if not event.real:
            self.items.resumed(event.turn)
            return
        self.cancel("barge_in")
        if event.turn is not None:  # a finished reply still playing is cut too
            self.items.cut(event.turn, time.monotonic())

    def _cancel_requested(self, event: CancelRequested) -> None:
        self.cancel("client_cancelled")
        self.items.cut_playing(time.monotonic())

    def _cancel_item(self, item_id: str) -> None:
        if self.turn is not None and self.turn.output_item_id == item_id:
            self.cancel("client_cancelled")

    def _response_requested(self, event: ResponseRequested) -> None:
        if self.replies.answering and self.turn is self._filling:
            self.cancel("superseded")  # the answer the filler stood in for
        if self.replies.answering:
            self.emit(Error("conversation_already_has_active_response", "a response is in progress; cancel it "
                            "(response.cancel) or wait for its response.done", event_id=event.event_id))
            return
        refs = [ref for role, ref in event.input or () if role == "item_reference"]
        missing = next((ref for ref in refs if self.conversation.get(ref) is None), None)
        if missing is not None:
            self.emit(Error("item_not_found", f"response.input: no conversation item {missing!r}",
                            event_id=event.event_id))
            return
        self._drop_speculation()
        speech_end, self.replies.called_for = self.replies.called_for or time.monotonic(), None
        self._reply(None, speech_end, event)

    def _idle(self, event: IdleTimedOut) -> None:
        """The caller has gone quiet: re-prompt them (the client hears of the timeout first), or say goodbye;
        not while a reply is still on its way."""
        if self.replies.answering:
            return
        self.emit(event)
        self._drop_speculation()
        self._reply(None, event.at, idle_reply(event, self.config.turn_detection.idle_prompts, self.config.spoken))

    def _item_created(self, event: ItemCreated) -> None:
        if event.role == "tool":  # a function's result: how long it took is learnt, and no filler is due
            self.tool_wait.answered(time.monotonic())
            if self._filler is not None:
                self._filler.cancel()
        self.items.created(event)

    def _calls_made(self, turn: Turn, names: tuple[str, ...]) -> None:
        """The reply called functions the client runs now: a filler if their results would keep the caller
        waiting past the answer's deadline."""
        if not turn.spoken or not self.config.fillers:
            return
        delay = self.tool_wait.called(names, time.monotonic(), turn.deadline)
        self._filler = self.spawn(self._fill_after(delay, turn))

    async def _fill_after(self, delay: float, called: Turn) -> None:
        await asyncio.sleep(delay)
        while called.active:  # its response.done is on its way to the client
            await asyncio.sleep(0.02)
        if self.tool_wait.waiting and not self.replies.answering:
            self._filling = self._reply(None, called.speech_end, filler_reply(next(self._phrases)))

    def _keyed(self, text: str) -> None:
        """The caller's keypad entry: their message, answered as a turn (unless a reply is under way, or the
        session leaves replies to the client)."""
        item_id = self.conversation.add("user", text)
        self.emit(ItemCreated(item_id, "user", text))
        detection = self.config.turn_detection
        if detection.create_response and not detection.manual and not self.replies.answering:
            self._drop_speculation()
            self._reply(item_id, time.monotonic())

    def _turn_ended(self, event: TurnEnded) -> None:
        final, turn = event.final, self.turn
        if (self.replies.speculating and turn.item_id == final.item_id
                and self._speculated == final.text.strip()):
            self._confirm(turn, final)
            return
        self._drop_speculation()
        self.conversation.add("user", final.text.strip(), final.item_id, spoken=True)
        if event.answer:
            self._reply(final.item_id, final.speech_end).ended(final.confirmed_at, final.speech_end + final.ready_s)

    def _reply(self, item_id: str | None, speech_end: float, asked: ResponseRequested | None = None,
               carried: Carried | None = None) -> Turn:
        """Answer the conversation as it stands, against the deadline counted from `speech_end`, as the
        client `asked` (other instructions, a length, text only, outside the conversation), after the
        `carried` call has run (one the client approved, or one a barge-in left running), if any."""
        asked = asked or ResponseRequested()
        self.cancel("superseded")
        spoken = self.config.spoken if asked.audio is None else asked.audio  # the session's as it is now
        turn = self.replies.new_turn(item_id, speech_end, spoken)
        turn.last = asked.last
        if not asked.out_of_band:
            self.conversation.add("assistant", "", turn.output_item_id, spoken=turn.spoken)
        own = None if asked.tools is None else self._own_tools(asked)
        tool_instructions = None if own is None else tools.instructions(*own) if own[1] else ""
        if asked.say is not None:
            prompt = []
        elif asked.input is not None:
            prompt = self.conversation.prompt_of(self._input(asked.input), asked.instructions, tool_instructions)
        else:
            prompt = self.conversation.prompt_ids(self.config.max_prompt_tokens, asked.pending, asked.instructions,
                                                  tool_instructions)
        # Out of band or on its own input, the reply shares no prefix with the conversation's session.
        request = ReplyRequest(prompt, None if asked.out_of_band or asked.input is not None else self.call_id,
                               asked.max_tokens or self.config.max_tokens, not asked.out_of_band,
                               tools=own, words_only=asked.words_only,
                               carried=carried, say=asked.say)
        self.replies.begin(turn, request, asked.metadata, asked.out_of_band)
        return turn

    def _own_tools(self, asked: ResponseRequested) -> tuple[tuple[Tool, ...], str | None]:
        """A reply's own tools and the choice among them, resolved now: a choice alone is among the session's
        tools as they are (its servers' listed ones too), after every update sent before it."""
        given = asked.tools
        offered = given.tools if given.tools is not None else self.config.offered
        try:
            return offered, tools.choose(list(offered), given.choice, "response.tool_choice")
        except ValueError as e:  # the tool it named is no longer offered: the reply calls nothing
            self.emit(Error("invalid_response", str(e), event_id=asked.event_id))
            return offered, None

    def _input(self, given: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
        """A reply's own input as messages, a referenced item as the conversation holds it."""
        messages = []
        for role, text in given:
            if role == "item_reference":
                item = self.conversation.get(text)
                if item is not None and item["content"]:
                    messages.append({"role": item["role"], "content": item["content"]})
            else:
                messages.append({"role": role, "content": text})
        return messages

    def _speculate(self, event: Speculate) -> None:
        """Begin the reply to the words at the pause; under semantic turns its prefill also reads whether the
        caller has finished (where the prompts line up; turn-taking asks otherwise)."""
        early = event.early
        self.cancel("superseded")
        turn = self.replies.new_turn(early.item_id, early.speech_end, self.config.spoken, speculative=True)
        turn.mark(Mark.PAUSE, early.paused_at)
        turn.mark(Mark.TRANSCRIPT)
        self._speculated = early.text.strip()
        prompt = self.conversation.prompt_ids(self.config.max_prompt_tokens,
                                              ({"role": "user", "content": self._speculated},))
        position = None
        if self.config.turn_detection.semantic:
            position = probe_position_for(self.conversation, self.tokenizer, self.config.max_prompt_tokens, prompt,
                                          early.text)
            if position is None:
                self.emit_upstream(Probed(early, None))
        self.replies.begin(turn, ReplyRequest(prompt, None, self.config.max_tokens, probe_at=position), early=early)

    def _drop_speculation(self, event: DropSpeculation | None = None) -> None:
        if self.replies.speculating:
            self.cancel("speculation_dropped")

    def _confirm(self, turn: Turn, final: TranscriptFinal) -> None:
        turn.confirm(final.speech_end, final.speech_end + self.config.ttfa_s)
        turn.ended(final.confirmed_at)
        self.conversation.add("user", self._speculated, final.item_id, spoken=True)
        self.conversation.add_reply(turn.output_item_id, self.replies.written, turn.spoken)
        # Its deadline is the turn's until the TTS stage, told of the confirmation, paces it; its session
        # keeps the conversation's prefix when it ends.
        self.engine.promote(turn.request_id, RequestClass.REALTIME, turn.deadline, self.call_id)
        self.emit(TurnConfirmed(turn))
