"""The last stage: what the client hears about, the reply audio it plays, and each turn's final numbers."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from voicepipe.pipeline.events import (
    AudioOut,
    BargeIn,
    BargeInResolved,
    Event,
    PlaybackPaused,
    Played,
    Playout,
    PlayoutCut,
    ReplyEnded,
    ResponseCreated,
    SpeechStarted,
    Truncated,
    TurnCancelled,
    TurnConfirmed,
    TurnDone,
)
from voicepipe.pipeline.outbound import AudioEnded, AudioSent, PlaybackCleared, ResponseDone, SessionDescribed
from voicepipe.pipeline.pacing import PlaybackClock
from voicepipe.pipeline.requests import SessionUpdate
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Mark, Reply, Turn, waterfall
from voicepipe.pipeline.turn_metrics import turn_metrics

# send(*events): what the client is told, rendered in its wire format by the call's transport, in order.
Send = Callable[..., Awaitable[None]]
HangUp = Callable[[], Awaitable[None]]  # ends the call from the server's side
MAX_FRAME_S = 2.0  # longer sentences go out in several frames, well under the usual 1 MiB message limits
CANCEL_REASONS = {"barge_in": "turn_detected", "client_cancelled": "client_cancelled"}
RECENT_TURNS = 16  # turns whose record is kept


@dataclass
class Delivered:
    """What the caller was sent of one turn, and, once it is cut off, what its item says."""

    chunks: int = 0
    underruns: int = 0  # chunks that arrived after the caller's buffer had run dry
    said: str | None = None


class ClientOutput(Stage):
    """Tells the client what it should hear of, and paces the reply audio against the caller's playback.

    Each audio chunk is reported upstream (`Played`, with when the caller's buffered audio will run out):
    the TTS stage works out from it when the LLM must deliver (when that audio runs out, less the time a
    sentence takes to synthesize), so the scheduler presses a turn only when its listener is about to hear
    silence; the LLM stage keeps it as what the caller heard. A chunk sent after the buffer ran dry is an
    underrun.

    A speculative turn's events are held until it is confirmed, then sent in order; if it is dropped
    instead, the caller never hears of it.

    A barge-in pauses the reply: its audio stops (the client drops what it had queued) and what follows is
    withheld, while the LLM stage hears what the caller said. Words cancel the reply (the LLM stage cuts
    its item to what was heard by the pause, `Truncated`); a backchannel or a cough resumes it where it
    stopped.

    A turn that is the call's last (the goodbye to an idle caller) hangs up once its audio has played, unless
    the caller speaks first.
    """

    def __init__(self, send: Send, registry: CollectorRegistry, sample_rate: int,
                 describe: Callable[[], dict] = dict, hang_up: HangUp | None = None) -> None:
        super().__init__()
        self.send, self.sample_rate, self.describe, self.hang_up = send, sample_rate, describe, hang_up
        self._goodbye: asyncio.Task | None = None  # hangs up when the last turn's audio has played
        self.clock = PlaybackClock()
        self.metrics = turn_metrics(registry)
        self._audible: Turn | None = None  # the turn whose audio the caller may still be playing
        self._sent: list[tuple[int, str, float, np.ndarray]] = []  # its audio: (sentence, text, start, pcm)
        self._current: Turn | None = None  # the newest turn the caller heard of, until it is finished
        self._paused: Turn | None = None  # the turn a barge-in paused, and what it has withheld since
        self._withheld: list[AudioOut | TurnDone] = []
        self._held: dict[Turn, list[Event]] = {}
        self._delivered: dict[Turn, Delivered] = {}  # the last RECENT_TURNS turns'
        # The events whose sending depends on the caller's playback; the rest go to the client as they are.
        self._own: dict[type[Event], Callable[[Any, float], Awaitable[None]]] = {
            SpeechStarted: self._speech_started, BargeIn: lambda e, now: self._pause(e.item_id, now),
            BargeInResolved: lambda e, now: self._resolve(e.real), SessionUpdate: self._session_updated,
            Truncated: self._truncated, ResponseCreated: self._response_created,
            AudioOut: lambda e, now: self._audio(e), TurnDone: self._turn_done, TurnCancelled: self._turn_cancelled}

    @property
    def replying(self) -> bool:
        """A response the caller heard of (`response.created` sent) has not ended (no `response.done` yet)."""
        return self._current is not None and not self._current.finished

    async def process(self, event: Event) -> None:
        turn: Turn | None = getattr(event, "turn", None)
        if isinstance(event, ResponseCreated) and event.held:
            self._held[event.turn] = [event]
        elif isinstance(event, TurnConfirmed):
            for held in self._held.pop(event.turn, []):
                await self._handle(held)
        elif turn is not None and turn in self._held:
            if isinstance(event, TurnCancelled):
                self._unheard("speculation", self._held.pop(turn))
            else:
                self._held[turn].append(event)
        elif turn is not None and turn is self._paused and isinstance(event, AudioOut | TurnDone):
            self._withheld.append(event)
        else:
            await self._handle(event)

    async def _handle(self, event: Event) -> None:
        own = self._own.get(type(event))
        if own is not None:
            await own(event, time.monotonic())
        else:
            await self.send(event)

    async def _speech_started(self, event: SpeechStarted, now: float) -> None:
        if self._goodbye is not None:  # the caller is back before the line went dead
            self._goodbye.cancel()
            self._goodbye = None
        if event.heard:
            await self.send(event)

    async def _session_updated(self, event: SessionUpdate, now: float) -> None:
        """Every stage before has applied the update: the client hears what the session is now."""
        await self.send(SessionDescribed(self.describe()))

    async def _response_created(self, event: ResponseCreated, now: float) -> None:
        turn = event.turn
        self._current = turn
        self._delivered[turn] = Delivered()
        while len(self._delivered) > RECENT_TURNS:
            del self._delivered[next(iter(self._delivered))]
        await self.send(event)

    async def _turn_done(self, event: TurnDone, now: float) -> None:
        if self._delivered_of(event.turn).chunks:
            await self.send(AudioEnded(event.turn))
        await self._finish(event.turn, event.reply, "completed")
        if event.turn.last and self.hang_up is not None:
            self._goodbye = self.spawn(self._hang_up_after(self.clock.playout_end))

    async def _turn_cancelled(self, event: TurnCancelled, now: float) -> None:
        if event.turn is self._paused:
            self._unheard(event.reason, self._withheld)
            self._paused, self._withheld = None, []
        if not event.turn.finished:
            await self._stop_audio(event.turn, now, event.reason)
            await self._finish(event.turn, event.reply, "cancelled", CANCEL_REASONS.get(event.reason, event.reason))

    def _unheard(self, why: str, events: list) -> None:
        """Reply audio thrown away before the caller heard it (what pacing synthesis to playback saves)."""
        seconds = sum(len(e.pcm) for e in events if isinstance(e, AudioOut)) / self.sample_rate
        if seconds:
            self.metrics.unheard.labels(why).inc(seconds)

    async def _hang_up_after(self, played_at: float) -> None:
        await asyncio.sleep(max(0.0, played_at - time.monotonic()))
        await self.hang_up()

    async def _audio(self, event: AudioOut, resumed: bool = False) -> None:
        step = int(MAX_FRAME_S * self.sample_rate)
        for start in range(0, len(event.pcm), step):
            await self._play(event, event.pcm[start:start + step], time.monotonic(), resumed)

    def _delivered_of(self, turn: Turn) -> Delivered:
        return self._delivered.setdefault(turn, Delivered())

    async def _play(self, audio: AudioOut, pcm: np.ndarray, now: float, resumed: bool = False) -> None:
        turn, sent = audio.turn, self._delivered_of(audio.turn)
        if turn.cancelled:
            return
        seconds = len(pcm) / self.sample_rate
        start, gap = self.clock.schedule(seconds, now)
        if not sent.chunks:
            turn.mark(Mark.FIRST_AUDIO, now)
        elif gap > 0 and not resumed:
            sent.underruns += 1
            self.metrics.underruns.inc()
        sent.chunks += 1
        if self._audible is not turn:
            self._sent = []
        self._sent.append((audio.index, audio.text, start, pcm))
        self._audible = turn
        self.emit_upstream(Played(turn, audio.index, audio.text, start, seconds, self.clock.playout_end, resumed,
                                  audio.ends))
        self.emit_upstream(Playout(pcm, self.sample_rate, start, audio.text))
        await self.send(AudioSent(turn, pcm.astype("<i2", copy=False), self.sample_rate))

    async def _pause(self, item_id: str, now: float) -> None:
        """The caller spoke over the reply: stop its audio where the caller is, keep the rest for later."""
        audible = self._audible if self._audible is not None and self.clock.buffered(now) > 0 else None
        current = self._current if self._current is not None and not self._current.finished else None
        turn = audible or current
        if turn is None or turn is self._paused:
            return
        self._paused, self._withheld = turn, []
        cut_at = None
        if audible is turn:
            rest = [(index, text, pcm[max(0, int((now - start) * self.sample_rate)):])
                    for index, text, start, pcm in self._sent if start + len(pcm) / self.sample_rate > now]
            self._withheld = [AudioOut(turn, pcm, index, text) for index, text, pcm in rest if len(pcm)]
            cut_at = now
            await self._clear_playback(turn, now)
        self.emit_upstream(PlaybackPaused(item_id, turn, cut_at))

    async def _resolve(self, real: bool) -> None:
        """The caller's words are known: drop the paused reply's audio (the LLM stage has cut it), or play
        it on from the pause."""
        turn, withheld = self._paused, self._withheld
        self._paused, self._withheld = None, []
        if real:
            self._unheard("barge_in", withheld)
        if turn is None or real:
            return
        for event in withheld:
            if isinstance(event, AudioOut):
                await self._audio(event, resumed=True)
            else:
                await self._handle(event)

    async def _stop_audio(self, turn: Turn, now: float, why: str) -> None:
        """The turn's audio still queued for the caller is dropped (and counted unheard)."""
        if self._audible is turn:
            if buffered := self.clock.buffered(now):
                self.metrics.unheard.labels(why).inc(buffered)
            await self._clear_playback(turn, now)

    async def _clear_playback(self, turn: Turn, now: float) -> None:
        """The caller's queued audio of `turn` is dropped, here and (told so) in the client."""
        self._audible, self._sent = None, []
        self.clock.clear(now)
        self.emit_upstream(PlayoutCut(now))
        await self.send(PlaybackCleared(turn))

    async def _truncated(self, event: Truncated, now: float) -> None:
        """A reply was cut off (its item says only what was heard): its audio stops; a client that asked
        is answered."""
        if event.said is not None:
            self._delivered_of(event.turn).said = event.said
        await self._stop_audio(event.turn, now, "cut")
        if event.audio_end_ms is not None:
            await self.send(event)

    async def _finish(self, turn: Turn, reply: Reply, status: str, reason: str | None = None) -> None:
        turn.finished = True
        self.emit_upstream(ReplyEnded(turn))
        turn.mark(Mark.DONE)
        first_audio = turn.timings.get(Mark.FIRST_AUDIO)
        met: bool | None = None
        if first_audio is not None:
            met = turn.speech_end + first_audio <= turn.deadline
        elif time.monotonic() > turn.deadline and not reply.calls:  # a call's answer is the next reply's
            met = False
        outcome = {True: "met", False: "missed"}.get(met, "cancelled" if status == "cancelled" else "no_audio")
        stages = waterfall(turn.timings)
        self.metrics.turn_ended(outcome, first_audio, turn.timings, stages)
        timings = {f"{stage}_s": round(seconds, 4) for stage, seconds in turn.timings.items()}
        delivered = self._delivered_of(turn)
        details = {"timings": timings, "waterfall": {stage: round(s, 4) for stage, s in stages.items()},
                   "deadline_met": met, "underruns": delivered.underruns}
        if reason is not None:
            details["status_details"] = {"type": status, "reason": reason}
        await self.send(ResponseDone(turn, reply, status, reply.text if delivered.said is None else delivered.said,
                                     details))

