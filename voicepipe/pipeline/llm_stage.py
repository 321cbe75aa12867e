"""The turn: the LLM answers the caller's transcript as a REALTIME request with a deadline."""

import asyncio
import time
from contextlib import aclosing
from typing import Any

from scheduler import Engine, RequestClass, SamplingParams
from voicepipe.events import (
    CancelRequested,
    Error,
    Event,
    ResponseCreated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TranscriptFinal,
    TurnCancelled,
    new_id,
)
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.pacing import Pacing
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Turn
from voicepipe.stages.base import chat_prompt_ids


class LLMStage(Stage):
    """Starts a turn for each final transcript and cancels it when the caller speaks over it.

    The request carries the call id as its session, so the conversation so far stays in the KV cache
    between turns and only the new messages are prefilled. A transcript that arrives while the caller is
    already speaking again joins the conversation without a reply: the next utterance answers both.
    """

    def __init__(self, engine: Engine, tokenizer: Any, conversation: Conversation, config: CallConfig,
                 pacing: Pacing, call_id: str) -> None:
        super().__init__()
        self.engine, self.tokenizer, self.conversation = engine, tokenizer, conversation
        self.config, self.pacing, self.call_id = config, pacing, call_id
        self.turn: Turn | None = None
        self._task: asyncio.Task | None = None
        self._user_speaking = False
        self._primed = False

    async def process(self, event: Event) -> None:
        self.emit(event)
        if isinstance(event, SpeechStarted):
            self._user_speaking = True
            self.cancel("barge_in")
            if not self._primed:
                self._primed = True
                self.spawn(self._prime())
        elif isinstance(event, SpeechStopped):
            self._user_speaking = False
        elif isinstance(event, CancelRequested):
            self.cancel("client_cancelled")
        elif isinstance(event, TranscriptFinal) and event.text.strip():
            self.conversation.add("user", event.text.strip())
            if not self._user_speaking:
                self._start(event)

    async def _prime(self) -> None:
        """Prefill the instructions while the caller speaks their first words: they stay in the KV cache
        as the call's prefix, so the first turn computes only the caller's message."""
        if not self.conversation.instructions:
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
        self.emit(TurnCancelled(turn, reason))

    def _start(self, final: TranscriptFinal) -> None:
        self.cancel("superseded")
        response_id = new_id("resp")
        turn = Turn(response_id, f"{self.call_id}-{response_id}", final.item_id, final.speech_end,
                    final.speech_end + self.config.ttfa_s, self.conversation.add("assistant", ""))
        turn.mark("final_transcript", final.speech_end + final.ready_s)
        self.turn = turn
        self.emit(ResponseCreated(turn))  # here, not in the task: a cancel may come before the task runs
        self._task = self.spawn(self._respond(turn))

    async def _respond(self, turn: Turn) -> None:
        prompt = self.conversation.prompt_ids(self.tokenizer, self.config.max_prompt_tokens)
        params = SamplingParams(max_tokens=self.config.max_tokens, temperature=self.config.temperature)
        stream = self.engine.generate(prompt, params, cls=RequestClass.REALTIME,
                                      deadline=self.pacing.llm_deadline(turn, time.monotonic()), session=self.call_id,
                                      request_id=turn.request_id)
        async with aclosing(stream) as outputs:
            async for out in outputs:
                if out.token_id is not None:
                    turn.mark("first_token")
                if out.text:
                    turn.text += out.text
                    self.emit(TextDelta(turn, out.text))
                if out.finished and (out.finish_reason or "").startswith("error"):
                    self.emit(Error("generation_failed", out.finish_reason or "", "server_error"))
        turn.llm_done = True
        turn.message["content"] = turn.text
        self.emit(TextDone(turn))
