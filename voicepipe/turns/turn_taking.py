"""The TurnTaking stage: between the transcripts and the LLM, it decides when the assistant speaks.

It tells the engine to expect the caller from their first silence (`Engine.expect`), so the turn's
work never waits behind a long step; at each pause it has the reply begun ahead (`Speculate`) and, under
semantic turns, asks the model whether the caller has finished (the verdict goes up to the endpointer as
`EndOfTurn`); at the end of an utterance it says whether to answer (`TurnEnded`). Words said over the
assistant are judged here too: a backchannel lets the reply play on, words cancel it (`BargeInResolved`),
and words that repeat what the assistant just said are its own echo: never a turn, never a barge-in; nor
is an utterance begun over the assistant's voice too short to have barged in.
"""

import time
from typing import Any

from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.end_of_turn import end_probability, is_backchannel, judged_ids
from voicepipe.pipeline.engine_port import Engine
from voicepipe.pipeline.events import (
    BargeInResolved,
    EchoPathJudged,
    EndOfTurn,
    Event,
    Feedback,
    InputCleared,
    PlaybackPaused,
    Playout,
    PlayoutCut,
    SpeechPaused,
    SpeechQuiet,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TranscriptEarly,
    TranscriptFinal,
    UtteranceDropped,
)
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Turn
from voicepipe.pipeline.verdicts import DropSpeculation, Probed, Speculate, TurnEnded
from voicepipe.turns.own_voice import OwnVoice
from voicepipe.turns.vad_stage import BARGE_IN_MS


class TurnTaking(Stage):
    """Says "reply now", "begin the reply ahead" and "drop it" as events, from the caller's speech, pauses
    and words; reads the conversation (for the judge's prompt) and writes nothing of it."""

    def __init__(self, engine: Engine, tokenizer: Any, conversation: Conversation, config: CallConfig,
                 call_id: str) -> None:
        super().__init__()
        self.engine, self.tokenizer, self.conversation = engine, tokenizer, conversation
        self.config, self.call_id = config, call_id
        self._speaking = False  # the caller is in an utterance
        self._over_item: str | None = None  # an utterance said over the reply, its words not yet known
        self._paused: Turn | None = None  # the reply that utterance paused, until the verdict
        self.own_voice = OwnVoice()
        self.echoes = 0  # transcripts taken for the assistant's own voice
        self._began: dict[str, float] = {}  # when each utterance not yet transcribed began
        # Utterances begun over the assistant's voice whose speech never reached a barge-in's length: what
        # the VAD heard of the echo's residue as it began (measured over 54 recorded calls in the echo
        # rooms: 1-3 windows of speech in all 16 such, "Thanks.", "I will." to the ASR; the callers' own
        # 432 utterances, 23 windows or more). Not a turn, as its own voice is not.
        self._sounds: set[str] = set()

    async def process(self, event: Event) -> None:
        if not isinstance(event, TranscriptFinal):  # a final transcript goes on once judged (below)
            self.emit(event)
        detection = self.config.turn_detection
        answering = detection.create_response and not detection.manual
        if isinstance(event, SpeechQuiet) and answering:
            self.engine.expect(self.call_id, event.speech_end + self.config.ttfa_s)
        elif isinstance(event, EchoPathJudged):
            self.own_voice.heard = event.heard
        elif isinstance(event, SpeechStarted):
            self._speaking = True
            self._began[event.item_id] = event.at
            self.emit(DropSpeculation())
        elif isinstance(event, SpeechPaused):
            self._judge_sound(event.item_id, event.voiced_ms, event.at)
        elif isinstance(event, SpeechStopped):
            self._speaking = False
            self._judge_sound(event.item_id, event.voiced_ms, event.at)
        elif isinstance(event, SpeechResumed | InputCleared):
            self.engine.expect(self.call_id, None)
            self.emit(DropSpeculation())
            if isinstance(event, InputCleared) and event.item_id is not None:
                self._began.pop(event.item_id, None)
                self._sounds.discard(event.item_id)
                self._spoken_over(event.item_id, "", final=True)  # dropped unheard: the reply goes on
        elif isinstance(event, TranscriptEarly) and event.text.strip():
            began = self._began.get(event.item_id, time.monotonic())
            if event.item_id in self._sounds or self.own_voice.is_echo(event.text, began):
                self._spoken_over(event.item_id, "", final=False)
            elif self._spoken_over(event.item_id, event.text):
                pass  # a backchannel so far: no reply of its own, unless more words follow
            elif self.config.speculative and detection.create_response:
                self.emit(Speculate(event))
            elif detection.semantic:
                self.spawn(self._judge(event))
        elif isinstance(event, TranscriptFinal):
            began = self._began.pop(event.item_id, time.monotonic())
            sound = event.item_id in self._sounds
            self._sounds.discard(event.item_id)
            if event.text.strip() and (sound or self.own_voice.is_echo(event.text, began)):
                self.echoes += 1
                self.emit(UtteranceDropped(event.item_id, event.text, "sound" if sound else "own_voice"))
                self._spoken_over(event.item_id, "", final=True)  # its own voice: the reply plays on, unanswered
                return
            self.emit(event)
            if not self._spoken_over(event.item_id, event.text, final=True) and event.text.strip():
                self.emit(TurnEnded(event, answer=answering and not self._speaking))

    async def feedback(self, event: Feedback) -> bool:
        if isinstance(event, Playout):  # on its way to the audio front end
            self.own_voice.played(event.text, event.start, event.start + len(event.samples) / event.sample_rate)
        elif isinstance(event, PlayoutCut):
            self.own_voice.cut(event.at)
        elif isinstance(event, PlaybackPaused):  # the caller's speech paused a reply: its words decide
            self._over_item, self._paused = event.item_id, event.turn
        elif isinstance(event, Probed):
            if event.probability is not None:
                self._verdict(event.early, event.probability)
            elif self.config.turn_detection.semantic:
                self.spawn(self._judge(event.early))
            return True
        return False

    def _judge_sound(self, item_id: str, voiced_ms: int | None, at: float) -> None:
        """Whether the utterance, so far, is a sound begun over the assistant's voice too short to have barged
        in (judged at each pause, and at its end: more speech may come). Not under manual turns, where the
        client says what an utterance is."""
        if voiced_ms is not None and voiced_ms < BARGE_IN_MS and not self.config.turn_detection.manual \
                and self.own_voice.over(self._began.get(item_id, at)):
            self._sounds.add(item_id)
        else:
            self._sounds.discard(item_id)

    def _spoken_over(self, item_id: str, text: str, final: bool = False) -> bool:
        """Whether `text`, said over the assistant, is only a backchannel (the reply goes on, and on the
        final transcript its audio resumes); words cancel the reply."""
        if item_id != self._over_item:
            return False
        paused, backchannel = self._paused, is_backchannel(text)
        if backchannel and not final:
            return True
        self._over_item, self._paused = None, None
        self.emit(BargeInResolved(item_id, real=not backchannel, turn=paused))
        return backchannel

    async def _judge(self, early: TranscriptEarly) -> None:
        """Under semantic turns: how long to wait for more speech, from how finished the words at the pause
        read to the model."""
        prompt = judged_ids(self.conversation, self.config.max_prompt_tokens, early.text)
        probability = await end_probability(self.engine, self.tokenizer, prompt, time.monotonic())
        if probability is not None:
            self._verdict(early, probability)

    def _verdict(self, early: TranscriptEarly, probability: float) -> None:
        """To the endpointer: end the utterance after the silence the probability asks for."""
        silence = self.config.turn_detection.silence_ms(probability, self.config.early_final_ms)
        self.emit_upstream(EndOfTurn(early.item_id, early.paused_at, probability, silence))
