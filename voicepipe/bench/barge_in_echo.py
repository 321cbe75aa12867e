"""Interruptions over the echo, tried many times: the caller's microphone stream, as `bench room` builds
it, through the call's audio front end and endpointer (the Silero VAD and the barge-in rule of
`turns.vad_stage`), without the server, so a room gets tens of tries in seconds.

Replies in the assistant's own voice play through the room one after another; in every other one the
caller speaks over it, from 0.8 to 2.5 s into its audio, and the loudspeaker stops where the barge-in
is heard (or 1.5 s after the onset, when it never is). Reported per room: the share of interruptions
whose barge-in came within 300 ms of their onset, the onset-to-barge-in p50 and p95, and false
barge-ins (heard while the caller was silent) per 100 replies.
"""

from collections.abc import Iterator

import numpy as np

from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.phone_line import PhoneLine
from voicepipe.bench.room import RATE, Room, active_rms, overlay
from voicepipe.bench.speakerphone import Loudspeaker
from voicepipe.frontend.processing import AudioProcessing, NoiseReduction
from voicepipe.turns.endpointer import Endpointer
from voicepipe.turns.vad_stage import BARGE_IN_MS, WINDOW_MS

FRAME = RATE // 50
INTERRUPTIONS = ["Stop.", "Wait, wait.", "No, tell me about cats instead.", "Hold on a second.",
                 "Sorry, that's not what I asked.", "Okay, stop there."]
CAUGHT_S = 0.3


class BargeInRule:
    """The endpointer's verdicts on a stream, read as the VAD stage reads them: a barge-in once an
    utterance holds BARGE_IN_MS of speech (its prefix padding counting as one window)."""

    def __init__(self) -> None:
        self.endpointer = Endpointer()
        self._speech_ms = 0
        self._fired = False

    def feed(self, audio: np.ndarray, unsuppressed: np.ndarray | None = None) -> list[int]:
        """The stream positions (samples) at which barge-ins were heard in `audio` (`unsuppressed`: the same
        before the noise suppressor, as the call passes it)."""
        found = []
        for boundary in self.endpointer.feed(audio, unsuppressed):
            if boundary.kind == "start":
                self._speech_ms, self._fired = WINDOW_MS, False
            elif boundary.kind == "audio" and boundary.is_speech and not self._fired:
                self._speech_ms += WINDOW_MS
                if self._speech_ms >= BARGE_IN_MS:
                    self._fired = True
                    found.append(boundary.position)
        return found


def replies(sentences: list[np.ndarray], n: int) -> Iterator[np.ndarray]:
    """`n` replies of three sentences each, drawn in turn from `sentences`, with the voice's own pauses."""
    for i in range(n):
        picked = [sentences[(3 * i + k) % len(sentences)] for k in range(3)]
        gap = np.zeros(RATE // 5, np.float32)
        yield np.concatenate([part for s in picked for part in (s, gap)])


def try_room(room: Room | None, noise: np.ndarray | None, front: bool, sentences: list[np.ndarray],
             voices: list[np.ndarray], voice_rms: float, reply_rms: float, n_replies: int = 40, seed: int = 0,
             suppressor: NoiseReduction = "near_field", phone: bool = False) -> dict:
    """One stream of `n_replies` replies through `room` (None: the loudspeaker is not heard), with `noise`
    (at its level in the microphone, looped) around the caller, over a phone line where `phone`; the front
    end on is the canceller and `suppressor`, off neither."""
    rng = np.random.default_rng(seed)
    speaker = Loudspeaker(room or Room(), voice_rms, reply_rms, phone)
    line = PhoneLine(RATE) if phone else None
    processing = AudioProcessing(echo=front, noise=suppressor if front else None)
    rule = BargeInRule()
    latencies: list[float | None] = []
    false_barge_ins, position = 0, 0
    for i, reply in enumerate(replies(sentences, n_replies)):
        speaker.receive((reply * 32767).astype(np.int16), RATE, position)
        onset = None
        voice = np.zeros(0, np.float32)
        if i % 2:
            onset = position + int(rng.uniform(0.8, 2.5) * RATE)
            clip = voices[int(rng.integers(len(voices)))]
            voice = clip * np.float32(voice_rms / active_rms(clip))
        end = position + len(reply) + RATE  # the reply, then a second of the room's quiet
        heard_at = None
        while position < end:
            mic = speaker.echo(position + FRAME, FRAME) if room is not None else np.zeros(FRAME, np.float32)
            if noise is not None:
                mic += noise[position % len(noise):][:FRAME]
            if onset is not None:
                overlay(mic, position, voice, onset)
            if line is not None:
                mic = line.process(mic)
            far = speaker.played[position:position + FRAME]
            far = np.pad(far, (0, FRAME - len(far)))
            for at in rule.feed(processing.process(mic, far), processing.unsuppressed):
                if onset is not None and at >= onset and heard_at is None:
                    heard_at = at
                    speaker.clear(position + FRAME)  # the client drops its queue
                elif onset is None or at < onset:
                    false_barge_ins += 1
            if onset is not None and heard_at is None and position > onset + 1.5 * RATE:
                speaker.clear(position + FRAME)
            position += FRAME
        if onset is not None:
            latencies.append(None if heard_at is None else (heard_at - onset) / RATE)
    caught = [x for x in latencies if x is not None]
    return {"interruptions": len(latencies), "caught_300ms": sum(1 for x in caught if x <= CAUGHT_S),
            "missed": len(latencies) - len(caught),
            "barge_in_p50_s": percentile(caught, 50) if caught else None,
            "barge_in_p95_s": percentile(caught, 95) if caught else None,
            "false_barge_ins_per_100_replies": 100 * false_barge_ins / n_replies}


def bench_barge_in(rooms: list[tuple[str, Room | None, np.ndarray | None, bool]], sentences: list[np.ndarray],
                   voices: list[np.ndarray], voice_rms: float, reply_rms: float, n_replies: int = 40) -> dict:
    """Every room with the front end on and off (off: nothing cancelled, as a call without it); each
    (name, room, noise, whether over a phone line)."""
    return {name: {"on" if front else "off": try_room(room, noise, front, sentences, voices, voice_rms, reply_rms,
                                                      n_replies, phone=phone)
                   for front in ((True, False) if room is not None or noise is not None else (True,))}
            for name, room, noise, phone in rooms}
