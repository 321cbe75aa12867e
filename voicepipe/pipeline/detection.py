"""How a call decides that the caller's turn is over: the modes a client may choose, and their settings.

- `semantic_vad` (the default): at the first short pause the LLM reads the transcript so far and says how
  likely the sentence is over (`pipeline.end_of_turn`). Likely: the turn ends at once. Less likely: the
  endpointer waits for more speech, the longer the less likely, up to the eagerness' longest silence,
  then ends the turn anyway. A pause inside a sentence ("What is the capital of ... France?") so stays
  one utterance, and a finished question is answered without waiting out a fixed silence.
- `server_vad`: a fixed silence (`silence_duration_ms`) ends every turn, as the OpenAI Realtime API's
  server VAD does.
- manual (`type: null`): the client commits its audio and asks for responses; the server detects nothing
  and never answers by itself.

`create_response: false` keeps the detection but leaves replies to the client's `response.create`;
`interrupt_response: false` lets the caller speak over a reply without stopping it.

`idle_timeout_ms` (off by default) re-prompts a caller who says nothing for that long after a reply has
played (`input_audio_buffer.timeout_triggered`, then a reply); after `idle_prompts` re-prompts in a row
went unanswered, the next timeout says goodbye and ends the call (`idle_prompts: null` never does).
"""

import math
from dataclasses import asdict, dataclass
from typing import Any

TYPES = ("server_vad", "semantic_vad")  # and None: manual


@dataclass(frozen=True, slots=True)
class Eagerness:
    """How readily a semantic turn ends: the probability of a finished sentence that ends it at the first
    pause, and the one (or less) that waits the longest silence for more speech; between the two the
    silence waited grows with the log of how unlikely the end is."""

    end_probability: float
    max_silence_ms: int
    floor_probability: float

    def silence_ms(self, probability: float, pause_ms: int) -> int:
        """The silence after the last speech that ends a turn the LLM gave `probability` of being over."""
        if probability >= self.end_probability:
            return pause_ms
        share = math.log(self.end_probability / max(probability, 1e-12)) / math.log(
            self.end_probability / self.floor_probability)
        return int(pause_ms + min(1.0, share) * (self.max_silence_ms - pause_ms))


# Set on `voicepipe bench turns` (docs/performance.md, "Turn-taking, measured"; tuned on that set, so read its
# figures as an upper bound): most finished questions get over 0.05 and most sentences cut at a word boundary under
# 0.003 (Whisper's words at a pause are often garbled, so neither all). A cut sentence whose wait outlasts
# the caller's pause stays whole, so past about 1.5 s a longer wait buys little but silence after the
# finished questions the judge doubted. The Realtime API's longest waits are 8, 4 and 2 s.
EAGERNESS = {"low": Eagerness(0.1, 3000, 3e-3), "medium": Eagerness(0.05, 1500, 3e-3),
             "high": Eagerness(0.03, 1000, 3e-3)}
EAGERNESS["auto"] = EAGERNESS["medium"]
RANGES = {"threshold": (0.01, 0.99), "prefix_padding_ms": (0, 2000), "silence_duration_ms": (100, 5000)}
NULLABLE = {"idle_timeout_ms": (1000, 600_000), "idle_prompts": (0, 100)}  # whole numbers, or null: off
FLAGS = ("create_response", "interrupt_response")


@dataclass(slots=True)
class TurnDetection:
    """The endpointing settings a client may change with `session.update` (the endpointer reads them live)."""

    type: str | None = "semantic_vad"
    threshold: float = 0.5  # the VAD's speech probability
    prefix_padding_ms: int = 300  # audio kept before the detected start of speech
    silence_duration_ms: int = 500  # server_vad: the silence that ends a turn
    eagerness: str = "auto"  # semantic_vad
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None  # re-prompt a caller silent this long after a reply played
    idle_prompts: int | None = 2  # unanswered re-prompts before the goodbye (None: never hang up)

    @property
    def manual(self) -> bool:
        return self.type is None

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad"

    @property
    def max_silence_ms(self) -> int:
        """The silence after which the turn ends whatever was said."""
        return EAGERNESS[self.eagerness].max_silence_ms if self.semantic else self.silence_duration_ms

    def silence_ms(self, probability: float, pause_ms: int) -> int:
        """Under semantic turns, the silence that ends a turn whose words the LLM judged `probability`."""
        return EAGERNESS[self.eagerness].silence_ms(probability, pause_ms)

    def end_after_pause_s(self, pause_ms: int) -> float:
        """How long after the first pause (`pause_ms` of silence) the end of speech should be confirmed: at
        once under semantic turns (when the LLM reads the message finished), when the silence runs out
        under server_vad."""
        return 0.0 if self.semantic else max(0, self.silence_duration_ms - pause_ms) / 1000

    def describe(self) -> dict[str, Any] | None:
        """As a client reads it back: null when manual, else only the fields of its type."""
        if self.manual:
            return None
        fields = asdict(self)
        drop = ("silence_duration_ms",) if self.semantic else ("eagerness",)
        return {k: v for k, v in fields.items() if k not in drop}


def check_update(update: Any, current: TurnDetection) -> dict[str, Any]:
    """The fields of a `turn_detection` update, checked; ValueError names the first bad one.

    `null` turns detection off (manual turns). An object may leave out `type` to keep the current one.
    """
    if update is None:
        return {"type": None}
    if not isinstance(update, dict):
        raise ValueError("turn_detection must be an object or null")
    checked: dict[str, Any] = {}
    for name, value in update.items():
        if name == "type":
            if value not in TYPES:
                raise ValueError(f"turn_detection.type must be one of {', '.join(TYPES)} (or turn_detection null)")
        elif name == "eagerness":
            if value not in EAGERNESS:
                raise ValueError(f"turn_detection.eagerness must be one of {', '.join(EAGERNESS)}")
        elif name in FLAGS:
            if not isinstance(value, bool):
                raise ValueError(f"turn_detection.{name} must be true or false")
        elif name in NULLABLE:
            lo, hi = NULLABLE[name]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi):
                raise ValueError(f"turn_detection.{name} must be a whole number in [{lo}, {hi}] or null")
        elif name in RANGES:
            lo, hi = RANGES[name]
            number = (float, int) if name == "threshold" else (int,)
            if isinstance(value, bool) or not isinstance(value, number) or not lo <= value <= hi:
                raise ValueError(f"turn_detection.{name} must be a number in [{lo}, {hi}]")
        else:
            raise ValueError(f"unknown turn_detection field {name!r}")
        checked[name] = value
    if "type" not in checked and current.manual:
        checked["type"] = "semantic_vad"  # an object turns detection back on
    return checked
