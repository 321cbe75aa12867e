"""One assistant response: the record its stages share, and what of it the caller actually heard."""

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from voicepipe.ids import new_id


@dataclass(eq=False)
class Turn:
    """Ids, deadline, timings and playback of one response.

    Timings are seconds from the end of the caller's speech (`speech_end`), keyed by stage:
    final_transcript, first_token, first_sentence, first_audio.
    """

    response_id: str
    request_id: str
    item_id: str | None  # the user utterance it answers (None: asked for with response.create)
    speech_end: float
    deadline: float  # when its first audio is due
    text: str = ""
    sentences: list[str] = field(default_factory=list)
    playback: list[tuple[int, float, float]] = field(default_factory=list)  # (sentence, start, seconds)
    timings: dict[str, float] = field(default_factory=dict)
    underruns: int = 0
    output_item_id: str = field(default_factory=lambda: new_id("item"))  # its assistant message's id
    prompt_tokens: int = 0
    output_tokens: int = 0
    audio_stopped_at: float | None = None  # when the caller's playback of it was cut off
    llm_done: bool = False
    speculative: bool = False  # started at a pause, before the end of the utterance was confirmed
    spoken: bool = True  # False: a text-only reply
    calls: list = field(default_factory=list)  # the function calls it made: (item id, tools.Call)
    cancelled: bool = False
    finished: bool = False  # response.done was sent

    @property
    def active(self) -> bool:
        return not (self.cancelled or self.finished)

    def mark(self, stage: str, now: float | None = None) -> None:
        """Record when a stage first happened (later calls keep the first time)."""
        self.timings.setdefault(stage, (time.monotonic() if now is None else now) - self.speech_end)

    def confirm(self, speech_end: float, deadline: float) -> None:
        """The speculation held: time the turn from the confirmed end of speech, as any other."""
        shift = self.speech_end - speech_end
        self.timings = {stage: seconds + shift for stage, seconds in self.timings.items()}
        self.speech_end, self.deadline, self.speculative = speech_end, deadline, False

    def stop_audio(self, now: float) -> None:
        """The caller's playback was cut off at `now`: nothing later counts as heard."""
        if self.audio_stopped_at is None:
            self.audio_stopped_at = now

    def played_text(self, now: float) -> str:
        """The reply as far as the caller heard it by `now`: whole sentences, then a share of the words of
        the sentence playing, in proportion to its audio played (as the Realtime API truncates)."""
        if self.audio_stopped_at is not None:
            now = min(now, self.audio_stopped_at)
        return self._heard(lambda start, seconds, before: min(max(now - start, 0.0), seconds))

    def text_until(self, audio_s: float) -> str:
        """The reply as far as its first `audio_s` seconds of audio say (what a client that stopped playing
        there heard)."""
        return self._heard(lambda start, seconds, before: min(max(audio_s - before, 0.0), seconds))

    def _heard(self, played_of: Callable[[float, float, float], float]) -> str:
        """Words heard, given how many seconds of each chunk (start, seconds, audio before it) were played."""
        total: dict[int, float] = defaultdict(float)
        played: dict[int, float] = defaultdict(float)
        before = 0.0
        for index, start, seconds in self.playback:
            total[index] += seconds
            played[index] += played_of(start, seconds, before)
            before += seconds
        heard: list[str] = []
        for index in sorted(total):
            words = self.sentences[index].split()
            share = played[index] / total[index] if total[index] else 1.0
            keep = len(words) if share >= 0.999 else int(share * len(words))
            heard += words[:keep]
            if keep < len(words):
                break
        return " ".join(heard)
