"""Voice calls as the pipeline schedules them, turn by turn, on a driver's clock.

Each turn of a call goes the way the server's stages send it to the engine: at the pause after the
caller's speech the final ASR pass runs as a REALTIME job (deadline: the end of speech); its transcript
starts a REALTIME request in the call's session (the conversation so far stays in the KV cache), due
by the pipeline's own `Pacing` (time to first audio before any audio, then when the caller's buffered
audio runs out); every `sentence_tokens` tokens a sentence goes to synthesis as a REALTIME job, one at a
time and each once the caller has no more than `synthesis_horizon_s` left to hear, due when the caller's
audio runs out; its audio plays on the caller's `PlaybackClock`. Where the device's prices say so
(`JobPrices.batch`), final passes and sentences due together run as one batch, as the engine's handlers
take them. A turn is on time when its first audio is sent by its deadline (end of speech + `ttfa_s`), as
the output stage judges it. The caller speaks again `think_s` after the reply's audio ends.

Left out: partial transcripts, speculative replies started at the pause, and barge-in.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler import RequestClass, SamplingParams, Sequence
from scheduler.jobs import JobHandler, JobResult, make_job
from scheduler.request import Output
from scheduler.sim import Driver
from voicepipe.backends.loading import ASR_FINAL, TTS_SENTENCE
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.pacing import Pacing, PlaybackClock
from voicepipe.pipeline.turn import Turn
from voicepipe.simulate.costs import JobPrices
from voicepipe.simulate.text import prompt_ids

CHARS_PER_S = 15.0  # speech rate the pipeline's pacing starts from (Pacing's default)
DEFAULT_CALL = CallConfig()


@dataclass(frozen=True, slots=True)
class CallLoad:
    calls: int = 1
    turns: int = 4
    speech_s: float = 3.0  # how long the caller speaks each turn
    think_s: float = 1.0  # silence after the reply's audio, before the caller speaks again
    pause_s: float = DEFAULT_CALL.early_final_ms / 1000  # silence before the final ASR pass starts
    ttfa_s: float = DEFAULT_CALL.ttfa_s
    instructions_tokens: int = 120  # the system prompt, prefilled when the call starts
    question_tokens: int = 24  # the caller's words each turn, as tokens
    reply_tokens: int = 48  # what each reply runs to
    sentence_tokens: int = 16  # a sentence goes to synthesis every so many tokens
    chars_per_token: float = 4.0
    synthesis_horizon_s: float = DEFAULT_CALL.synthesis_horizon_s  # a sentence waits while more is left to hear
    seed: int = 0

    def describe(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass
class TurnRecord:
    call: int
    index: int
    speech_end: float  # seconds into the run
    deadline: float
    transcript_at: float | None = None
    first_token_at: float | None = None
    first_audio_at: float | None = None
    done_at: float | None = None
    underruns: int = 0

    @property
    def ttfa_s(self) -> float | None:
        return None if self.first_audio_at is None else self.first_audio_at - self.speech_end

    @property
    def on_time(self) -> bool:
        return self.first_audio_at is not None and self.first_audio_at <= self.deadline


@dataclass
class Call:
    """One caller: its conversation's tokens, its pacing and playback, and its turns' records."""

    number: int
    load: CallLoad
    prices: JobPrices
    driver: Driver
    vocab: int
    turns: list[TurnRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.session = f"call-{self.number}"
        self.history = prompt_ids(1_000_000 + self.number, self.load.instructions_tokens, self.vocab)
        self.pacing, self.playback = Pacing(), PlaybackClock()

    # -- the call ----------------------------------------------------------------------------------------
    def start(self, at_s: float) -> None:
        def begin() -> None:
            self.driver.engine.open_session(self.session)
            prime = Sequence(list(self.history), SamplingParams(max_tokens=1, ignore_eos=True),
                             RequestClass.INTERACTIVE, session=self.session, request_id=f"{self.session}-prime")
            prime.arrival = self.driver.clock.now()
            self.driver.add_request(prime)
            self._speak(self.driver.now())

        self.driver.at(at_s, begin)

    def _speak(self, starts_s: float) -> None:
        """The caller speaks from `starts_s`; the final pass starts at the pause after it."""
        speech_end = starts_s + self.load.speech_s
        record = TurnRecord(self.number, len(self.turns), speech_end, speech_end + self.load.ttfa_s)
        self.turns.append(record)
        self.driver.at(speech_end + self.load.pause_s, lambda: self._transcribe(record))

    def _transcribe(self, record: TurnRecord) -> None:
        job = make_job(ASR_FINAL, (self.load.speech_s,), RequestClass.REALTIME,
                       self.driver.start + record.speech_end, f"{self.session}-asr-{record.index}")
        self.driver.submit_job(job, lambda result: self._reply(record, result))

    # -- a reply -----------------------------------------------------------------------------------------
    def _reply(self, record: TurnRecord, result: JobResult) -> None:
        now, start = self.driver.clock.now(), self.driver.start
        record.transcript_at = now - start
        question = prompt_ids(2_000_000 + 1000 * self.number + record.index, self.load.question_tokens, self.vocab)
        prompt = self.history + question
        turn = Turn(f"{self.session}-{record.index}", f"{self.session}-turn-{record.index}", None,
                    start + record.speech_end, start + record.deadline)
        seq = Sequence(prompt, SamplingParams(max_tokens=self.load.reply_tokens, ignore_eos=True),
                       RequestClass.REALTIME, self.pacing.llm_deadline(turn, now), self.session, turn.request_id)
        seq.arrival = now
        state = _Reply(record, turn, seq)
        self.driver.add_request(seq, lambda out: self._token(state, out))

    def _token(self, state: "_Reply", out: Output) -> None:
        if out.token_id is not None:
            if state.record.first_token_at is None:
                state.record.first_token_at = self.driver.now()
            state.unsaid += 1
        if state.unsaid and (state.unsaid >= self.load.sentence_tokens or out.finished):
            self._sentence(state, state.unsaid)
            state.unsaid = 0
        if out.finished:
            state.written = True
            self.history = state.seq.tokens[:len(state.seq.prompt_ids) + state.seq.params.max_tokens]
            self._maybe_done(state)

    def _sentence(self, state: "_Reply", tokens: int) -> None:
        text = "x" * round(tokens * self.load.chars_per_token)
        index = state.sentences
        state.sentences += 1
        self.pacing.expect(state.turn, index, text)
        state.queue.append((index, text))
        self._paced(state)
        self._synthesize(state)

    def _synthesize(self, state: "_Reply") -> None:
        """One sentence at a time, in order, as the TTS stage's worker takes them, each once the caller has
        no more than the horizon left to hear."""
        if state.speaking or not state.queue:
            return
        early = self.playback.buffered(now := self.driver.clock.now()) - self.load.synthesis_horizon_s
        if early > 0:
            state.speaking = True  # waiting for the horizon holds the worker as the stage's sleep does
            self.driver.at(now + early - self.driver.start, lambda: self._horizon_reached(state))
            return
        index, text = state.queue.pop(0)
        state.speaking = True
        job = make_job(TTS_SENTENCE, (len(text),), RequestClass.REALTIME, self.pacing.tts_deadline(state.turn),
                       f"{state.turn.request_id}-tts-{index}")
        self.driver.submit_job(job, lambda result: self._spoken(state, index, text, result))

    def _horizon_reached(self, state: "_Reply") -> None:
        state.speaking = False
        self._synthesize(state)

    def _spoken(self, state: "_Reply", index: int, text: str, result: JobResult) -> None:
        now = self.driver.clock.now()
        audio_s = float(result.value)
        self.pacing.synthesized(state.turn, index, text, audio_s, result.seconds)
        _, gap = self.playback.schedule(audio_s, now)
        if state.record.first_audio_at is None:
            state.record.first_audio_at = now - self.driver.start
        elif gap > 0:
            state.record.underruns += 1
        self.pacing.played(state.turn, self.playback.playout_end)
        self._paced(state)
        state.speaking = False
        state.spoken += 1
        self._synthesize(state)
        self._maybe_done(state)

    def _paced(self, state: "_Reply") -> None:
        """The TTS stage's `Paced`: the request is due when the caller's audio runs out, less a synthesis."""
        if not state.written:
            self.driver.engine.set_deadline(state.seq.request_id,
                                            self.pacing.llm_deadline(state.turn, self.driver.clock.now()))

    def _maybe_done(self, state: "_Reply") -> None:
        if not (state.written and state.spoken == state.sentences) or state.record.done_at is not None:
            return
        state.record.done_at = self.driver.now()
        heard_until = max(self.playback.playout_end, self.driver.clock.now()) - self.driver.start
        if len(self.turns) < self.load.turns:
            self.driver.at(heard_until + self.load.think_s, lambda: self._speak(self.driver.now()))
        else:
            self.driver.at(heard_until, lambda: self.driver.engine.release_session(self.session))


@dataclass
class _Reply:
    record: TurnRecord
    turn: Turn
    seq: Sequence
    unsaid: int = 0  # tokens since the last sentence
    sentences: int = 0
    spoken: int = 0
    speaking: bool = False
    written: bool = False
    queue: list[tuple[int, str]] = field(default_factory=list)


def start_calls(driver: Driver, load: CallLoad, prices: JobPrices, vocab: int) -> list[Call]:
    """The calls, each starting at a random moment of the first turn's span so their turns interleave."""
    rng = random.Random(load.seed)
    calls = [Call(n, load, prices, driver, vocab) for n in range(load.calls)]
    for call in calls:
        call.start(rng.uniform(0, load.speech_s + load.think_s))
    return calls


def priced_jobs(prices: JobPrices) -> dict[str, JobHandler]:
    """The job kinds a call submits, priced for the virtual engine: (device seconds, value), or where the
    device runs several calls' jobs of a kind at once (`prices.batch`), (the run's seconds, each one's value)."""

    def asr(audio_s: float) -> tuple[float, str]:
        return prices.asr_final_s, "transcript"

    def tts(chars: int) -> tuple[float, float]:
        return prices.tts_per_audio_s * chars / CHARS_PER_S, chars / CHARS_PER_S

    return {ASR_FINAL: _batched(asr, prices), TTS_SENTENCE: _batched(tts, prices)}


def _batched(alone: Callable[..., tuple[float, Any]], prices: JobPrices) -> JobHandler:
    """A priced job kind as a handler: one job a run, or up to `prices.batch` at the run's price."""
    if prices.batch == 1:
        return JobHandler(alone)

    def run(batch: list[tuple]) -> tuple[float, list]:
        priced = [alone(*args) for args in batch]
        return prices.run_s([seconds for seconds, _ in priced]), [value for _, value in priced]

    return JobHandler(run, prices.batch)
