"""The turn: the LLM answers the caller's transcript as a REALTIME request with a deadline."""

import asyncio
import time
from contextlib import aclosing
from typing import Any

from scheduler import RequestClass, SamplingParams
from scheduler.client import EngineClient
from voicepipe import tools
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.ids import new_id
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.end_of_turn import (
    end_probability,
    is_backchannel,
    judged_prompt,
    probe_params,
    probe_position,
    unpunctuated,
)
from voicepipe.pipeline.events import (
    BargeIn,
    BargeInResolved,
    CallArguments,
    CallDone,
    CallStarted,
    CancelRequested,
    EndOfTurn,
    Error,
    Event,
    Feedback,
    InputCleared,
    ItemCreated,
    ItemFound,
    ItemRequested,
    Paced,
    PlaybackPaused,
    Played,
    ResponseCreated,
    ResponseRequested,
    SpeechQuiet,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TranscriptEarly,
    TranscriptFinal,
    Truncated,
    TruncateRequested,
    TurnCancelled,
    TurnConfirmed,
)
from voicepipe.pipeline.heard import Heard, RecentReplies
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Mark, Reply, Turn


class LLMStage(Stage):
    """Starts a turn for each final transcript, cancels it when the caller speaks words over it, and
    under semantic turns judges at each pause whether the caller has finished.

    The request carries the call id as its session, so the conversation so far stays in the KV cache
    between turns and only the new messages are prefilled. A transcript that arrives while the caller is
    already speaking again joins the conversation without a reply: the next utterance answers both.

    Speculative replies: the transcript taken at the caller's first pause starts a reply at once, as a
    REALTIME request outside the conversation, while the endpointer still waits to confirm the end of
    speech; under semantic turns its prefill also reads whether the caller has finished (`end_of_turn`).
    If the final transcript is the same, the turn is confirmed (its messages join the conversation, what
    it held back is released); if the caller speaks again, it is dropped before anything of it was sent.

    Every turn is timed from the caller's last voiced frame. From the caller's first silence until the
    turn's first audio, the engine is told to expect them (`EngineClient.expect`), so the work of that
    turn never waits behind a long step.

    This stage owns the conversation: it also keeps what the caller heard of each recent reply (from the
    output stage's `Played` and `PlaybackPaused` feedback), so that a reply cut off by the caller, a
    cancel or the client's truncate keeps only its heard words before anything reads the conversation
    again; the output stage is told (`Truncated`) and stops the audio.
    """

    def __init__(self, engine: EngineClient, tokenizer: Any, conversation: Conversation, config: CallConfig,
                 call_id: str) -> None:
        super().__init__()
        self.engine, self.tokenizer, self.conversation = engine, tokenizer, conversation
        self.config, self.call_id = config, call_id
        self.turn: Turn | None = None
        self._written = Reply()  # what the LLM wrote for `turn`
        self._due: float | None = None  # when `turn`'s request must deliver, as the TTS stage last said
        self._heard = RecentReplies()  # what the caller heard of the recent replies
        self._paused: Turn | None = None  # the reply the caller's speech paused, until the verdict
        self._task: asyncio.Task | None = None
        self._user_speaking = False
        self._primed = False
        self._speculated = ""  # the user's words a speculative turn answers
        self._barge_item: str | None = None  # an utterance said over the reply, its words not yet known
        # The end of the caller's speech that a reply ending in a function call answered: the reply after
        # the call's output is timed from it, as the same turn.
        self._called_for: float | None = None

    async def process(self, event: Event) -> None:
        self.emit(event)
        detection = self.config.turn_detection
        if isinstance(event, SpeechQuiet):
            if not detection.manual and detection.create_response:
                self.engine.expect(self.call_id, event.speech_end + self.config.ttfa_s)
        elif isinstance(event, SpeechStarted):
            self._user_speaking, self._called_for = True, None
            self._drop_speculation()
            if not self._primed:
                self._primed = True
                self.spawn(self._prime())
        elif isinstance(event, BargeIn):
            if self.turn is not None and self.turn.active and not self.turn.speculative:
                self._barge_item = event.item_id
        elif isinstance(event, SpeechStopped):
            self._user_speaking = False
        elif isinstance(event, CancelRequested):
            self.cancel("client_cancelled")
            now = time.monotonic()
            for turn in self._heard.playing(now):  # audio still playing stops, even of a finished reply
                self._cut(turn, now)
        elif isinstance(event, TruncateRequested):
            self._truncate(event)
        elif isinstance(event, TranscriptEarly) and event.text.strip():
            judged = False
            if self._barging(event.item_id, event.text):
                pass  # a backchannel so far: no reply of its own, unless more words follow
            elif self.config.speculative and detection.create_response:
                judged = self._speculate(event)
            if detection.semantic and not judged:
                self.spawn(self._judge(event))
        elif isinstance(event, SpeechResumed | InputCleared):
            self.engine.expect(self.call_id, None)
            self._drop_speculation()
            if isinstance(event, InputCleared) and event.item_id is not None:
                self._barging(event.item_id, "", final=True)  # speech dropped unheard: the reply goes on
        elif isinstance(event, ItemCreated):
            self.conversation.add(event.role, event.text, event.item_id)
        elif isinstance(event, ItemRequested):
            self._item(event)
        elif isinstance(event, ResponseRequested):
            if self.turn is not None and self.turn.active and not self.turn.speculative:
                self.emit(Error("conversation_already_has_active_response", "a response is in progress; "
                                "cancel it (response.cancel) or wait for its response.done", event_id=event.event_id))
            else:
                self._drop_speculation()
                speech_end, self._called_for = self._called_for or time.monotonic(), None
                self._reply(None, speech_end, None, event)
        elif isinstance(event, TranscriptFinal):
            if self._barging(event.item_id, event.text, final=True) or not event.text.strip():
                return
            turn = self.turn
            if (turn is not None and turn.speculative and turn.active and turn.item_id == event.item_id
                    and self._speculated == event.text.strip()):
                self._confirm(turn, event)
                return
            self._drop_speculation()
            self.conversation.add("user", event.text.strip(), event.item_id, spoken=True)
            if not self._user_speaking and detection.create_response and not detection.manual:
                self._start(event)

    def _item(self, event: ItemRequested) -> None:
        """Read or delete a conversation item (deleting the reply in progress cancels it first)."""
        item = self.conversation.get(event.item_id)
        if item is None:
            self.emit(Error("item_not_found", f"no conversation item {event.item_id!r}", event_id=event.event_id))
            return
        if event.action == "delete":
            if self.turn is not None and self.turn.output_item_id == event.item_id:
                self.cancel("client_cancelled")
            self.conversation.delete(event.item_id)
        self.emit(ItemFound(event.item_id, event.action, item["role"], item["content"], item["spoken"]))

    async def feedback(self, event: Feedback) -> bool:
        if isinstance(event, Played):
            if (heard := self._heard.of(event.turn)) is not None:
                if not heard.chunks:  # the turn's first audio is out: the engine need not expect the caller
                    self.engine.expect(self.call_id, None)
                heard.add(event.index, event.text, event.start, event.seconds, event.resumed)
            return True
        if isinstance(event, Paced):
            turn = event.turn
            if turn is self.turn and not (self._written.done or turn.cancelled):  # this stage alone moves it
                self._due = event.due
                self.engine.set_deadline(turn.request_id, event.due)
            return True
        if not isinstance(event, PlaybackPaused):
            return False
        self._barge_item, self._paused = event.item_id, event.turn
        if event.at is not None and (heard := self._heard.of(event.turn)) is not None:
            heard.cut(event.at)
        return True

    def _barging(self, item_id: str, text: str, final: bool = False) -> bool:
        """Whether `text`, said over the assistant, is only a backchannel (the reply goes on, and on the
        final transcript its audio resumes); words cancel the reply."""
        if item_id != self._barge_item:
            return False
        paused, heard = self._paused, self._heard.of(self._paused)
        if is_backchannel(text):
            if final:
                self._barge_item, self._paused = None, None
                if heard is not None:
                    heard.resume()
                self.emit(BargeInResolved(item_id, real=False))
            return True
        self._barge_item, self._paused = None, None
        self.cancel("barge_in")
        if paused is not None:  # a finished reply still playing is cut too
            self._cut(paused, time.monotonic())
        self.emit(BargeInResolved(item_id, real=True))
        return False

    def _cut(self, turn: Turn, now: float, audio_end_ms: int | None = None) -> None:
        """The reply stops where the caller is (or where the client stopped playing it): its item keeps
        the words heard by then, and the output stage stops its audio."""
        heard = self._heard.of(turn) or Heard()
        heard.stop(now)
        said = heard.played_text(now) if audio_end_ms is None else heard.text_until(audio_end_ms / 1000)
        in_conversation = self.conversation.get(turn.output_item_id) is not None
        if in_conversation:
            self.conversation.truncate(turn.output_item_id, said)
        self.emit(Truncated(turn, said if in_conversation else None, audio_end_ms))

    def _truncate(self, event: TruncateRequested) -> None:
        turn = self._heard.turn(event.item_id)
        if turn is None:
            self.emit(Error("item_not_found", f"no assistant item {event.item_id!r} to truncate"))
        else:
            self._cut(turn, time.monotonic(), event.audio_end_ms)

    async def _judge(self, early: TranscriptEarly) -> None:
        """Under semantic turns: how long to wait for more speech, from how finished the words at the pause read."""
        probability = await end_probability(self.engine, self.tokenizer, self._judged(early), time.monotonic())
        self._verdict(early, probability)

    def _judged(self, early: TranscriptEarly) -> list[int]:
        """The conversation with the words at the pause, unpunctuated, as the judge reads them."""
        pending = ({"role": "user", "content": unpunctuated(early.text)},)
        return self.conversation.prompt_ids(self.config.max_prompt_tokens, pending)

    def _verdict(self, early: TranscriptEarly, probability: float | None) -> None:
        if probability is not None:
            silence = self.config.turn_detection.silence_ms(probability, self.config.early_final_ms)
            self.emit_upstream(EndOfTurn(early.item_id, early.paused_at, probability, silence))

    async def _prime(self) -> None:
        """Prefill the instructions while the caller speaks their first words: they stay in the KV cache
        as the call's prefix, so the first turn computes only the caller's message."""
        if not (self.conversation.instructions or self.conversation.tool_instructions):
            return
        prompt = chat_prompt_ids(self.tokenizer, self.conversation.messages()[:1])
        stream = self.engine.generate(prompt, SamplingParams(max_tokens=1), cls=RequestClass.INTERACTIVE,
                                      session=self.call_id)
        async with aclosing(stream) as outputs:
            async for _ in outputs:
                pass

    def cancel(self, reason: str) -> None:
        """Cancel the turn in progress, if any: its request is aborted as its stream closes."""
        turn = self.turn
        if turn is None or not turn.active:
            return
        turn.cancelled = True
        if self._task is not None:
            self._task.cancel()
        if not turn.speculative:  # a speculative turn is not in the conversation, nor heard
            self._cut(turn, time.monotonic())
        self.emit(TurnCancelled(turn, reason, self._written.copy()))

    def _start(self, final: TranscriptFinal) -> None:
        self._reply(final.item_id, final.speech_end, final)

    def _reply(self, item_id: str | None, speech_end: float, final: TranscriptFinal | None,
               asked: ResponseRequested | None = None) -> None:
        """Answer the conversation as it stands, against the deadline counted from `speech_end`, as the
        client `asked` (other instructions, a length, text only, outside the conversation)."""
        asked = asked or ResponseRequested(audio=self.config.spoken)
        self.cancel("superseded")
        turn = self._new_turn(item_id, speech_end, asked.audio)
        if not asked.out_of_band:
            self.conversation.add("assistant", "", turn.output_item_id, spoken=turn.spoken)
        if final is not None:
            turn.mark(Mark.TRANSCRIPT, final.speech_end + final.ready_s)
            if final.confirmed_at is not None:
                turn.mark(Mark.END_CONFIRMED, final.confirmed_at)
        prompt = self.conversation.prompt_ids(self.config.max_prompt_tokens,
                                              instructions=asked.instructions)
        # Out of band, the reply shares no prefix with the conversation's session.
        session = None if asked.out_of_band else self.call_id
        self._begin(turn, prompt, RequestClass.REALTIME, session, asked)

    def _speculate(self, early: TranscriptEarly) -> bool:
        """Start the reply to the words at the pause; True when its prefill also reads the end-of-turn
        verdict (semantic turns, prompts that line up)."""
        self.cancel("superseded")
        turn = self._new_turn(early.item_id, early.speech_end, self.config.spoken, speculative=True)
        turn.mark(Mark.PAUSE, early.paused_at)
        turn.mark(Mark.TRANSCRIPT)
        self._speculated = early.text.strip()
        pending = ({"role": "user", "content": self._speculated},)
        prompt = self.conversation.prompt_ids(self.config.max_prompt_tokens, pending)
        position = None
        if self.config.turn_detection.semantic:
            position = probe_position(prompt, judged_prompt(self.tokenizer, self._judged(early)))
        self._begin(turn, prompt, RequestClass.REALTIME, None, judge=None if position is None else (early, position))
        return position is not None

    def _drop_speculation(self) -> None:
        if self.turn is not None and self.turn.speculative:
            self.cancel("speculation_dropped")

    def _confirm(self, turn: Turn, final: TranscriptFinal) -> None:
        turn.confirm(final.speech_end, final.speech_end + self.config.ttfa_s)
        if final.confirmed_at is not None:
            turn.mark(Mark.END_CONFIRMED, final.confirmed_at)
        self.conversation.add("user", self._speculated, final.item_id, spoken=True)
        self.conversation.add("assistant", self._written.text, turn.output_item_id, spoken=turn.spoken)
        for item_id, call in self._written.calls:
            if call.arguments:  # complete (one still being written joins when it is)
                self.conversation.add("assistant", tools.call_text(call.name, call.arguments), item_id)
        # Its deadline is the turn's until the TTS stage, told of the confirmation, paces it; its session
        # keeps the conversation's prefix when it ends.
        self.engine.promote(turn.request_id, RequestClass.REALTIME, turn.deadline, self.call_id)
        self.emit(TurnConfirmed(turn))

    def _said(self, turn: Turn, reply: Reply, pieces: list[tuple[str, Any]], in_conversation: bool) -> None:
        """The reply's text goes on to be spoken; a function call becomes an item of its own, never spoken
        (and, out of band, never part of the conversation)."""
        for kind, value in pieces:
            if kind == "text" and value:
                reply.text += value
                self.emit(TextDelta(turn, value))
            elif kind == "start":
                reply.calls.append((new_id("item"), value))
                self.emit(CallStarted(turn, reply.calls[-1][0], value))
            elif kind == "arguments":
                self.emit(CallArguments(turn, reply.calls[-1][0], reply.calls[-1][1].call_id, value))
            elif kind == "end":
                item_id = reply.calls[-1][0]
                reply.calls[-1] = (item_id, value)
                if in_conversation and not turn.speculative:  # a speculative turn's join it if it is confirmed
                    self.conversation.add("assistant", tools.call_text(value.name, value.arguments), item_id)
                self._called_for = turn.speech_end
                self.emit(CallDone(turn, item_id, value))

    def _new_turn(self, item_id: str | None, speech_end: float, spoken: bool, speculative: bool = False) -> Turn:
        response_id = new_id("resp")
        turn = Turn(response_id, f"{self.call_id}-{response_id}", item_id, speech_end,
                    speech_end + self.config.ttfa_s, spoken, speculative)
        self._heard.add(turn)
        return turn

    def _begin(self, turn: Turn, prompt: list[int], cls: RequestClass, session: str | None,
               asked: ResponseRequested | None = None, judge: tuple[TranscriptEarly, int] | None = None) -> None:
        asked = asked or ResponseRequested()
        self.turn, self._written, self._due = turn, Reply(prompt_tokens=len(prompt)), None
        turn.mark(Mark.REPLY_STARTED)  # before the end of speech (a negative time) when speculative
        # Here, not in the task: a cancel may come before the task runs.
        self.emit(ResponseCreated(turn, turn.speculative, asked.metadata, asked.out_of_band))
        self._task = self.spawn(self._respond(turn, self._written, prompt, cls, session,
                                              asked.max_tokens or self.config.max_tokens, not asked.out_of_band,
                                              judge))

    async def _respond(self, turn: Turn, reply: Reply, prompt: list[int], cls: RequestClass, session: str | None,
                       max_tokens: int, in_conversation: bool = True,
                       judge: tuple[TranscriptEarly, int] | None = None) -> None:
        """Stream the reply; with `judge` (the pause and a prompt position), its prefill also reads the
        end-of-turn verdict there, delivered with the first token."""
        choice = tools.choose(list(self.config.tools), self.config.tool_choice)
        params = SamplingParams(max_tokens=max_tokens, temperature=self.config.temperature,
                                grammar=tools.grammar(list(self.config.tools), choice) if choice else None)
        if judge is not None:
            params = probe_params(self.tokenizer, params, judge[1])
        parser = tools.CallParser() if choice else None
        # The TTS stage's pacing of this turn, if it came before the request (else the turn's own deadline,
        # until it does).
        deadline = turn.deadline if self._due is None else self._due
        stream = self.engine.generate(prompt, params, cls=cls, deadline=deadline, session=session,
                                      request_id=turn.request_id)
        async with aclosing(stream) as outputs:
            async for out in outputs:
                if judge is not None and out.probe is not None:
                    self._verdict(judge[0], out.probe)
                if out.token_id is not None:
                    turn.mark(Mark.FIRST_TOKEN)
                    reply.output_tokens += 1
                if out.text or out.finished:
                    pieces = [("text", out.text)] if parser is None else parser.feed(out.text)
                    self._said(turn, reply, pieces + (parser.flush() if parser is not None and out.finished else []),
                               in_conversation)
                if out.finished and (out.finish_reason or "").startswith("error"):
                    self.emit(Error("generation_failed", out.finish_reason or "", "server_error"))
        reply.done = True
        turn.mark(Mark.TEXT_DONE)
        if not turn.spoken:  # no first audio will say the caller was answered
            self.engine.expect(self.call_id, None)
        self.conversation.set_reply(turn.output_item_id, reply.text)
        self.emit(TextDone(turn, reply.copy()))
