"""`voicepipe bench room`: a speakerphone caller in synthetic rooms, over the real websocket, to a real
server with the default models, with the audio front end on and off.

The caller (espeak-ng's voice, unlike the assistant's Piper voice) asks the questions one at a time. Its
microphone hears its own voice, what its loudspeaker plays of the replies through the room
(`voicepipe.bench.speakerphone`), and the room's noise; it sends all of that in real time (in the phone
rooms through a G.711 line, which the reply also comes through: `voicepipe.bench.phone_line`). In one turn of
each room it asks for a story and speaks over its reply a second into its audio (a real interruption).
Reported per room: questions heard and their word error, replies, questions cut (a reply begun before the
caller's last word: a premature end of turn), false barge-ins (the reply's audio cleared
while the caller was silent), phantom transcripts (an utterance begun while the caller was silent),
interruptions caught within 300 ms of their onset, utterances the server dropped as its own voice (and any
of them begun while the caller spoke: their words lost), first audio from the question's last word, and the
front end's CPU per call (the front end run again over the call's recorded microphone and loudspeaker
audio). With several calls a room their figures are summed, and each false barge-in and phantom is listed
with where it came.
"""

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import websockets

from voicepipe.audio import to_pcm16
from voicepipe.bench.barge_in_echo import INTERRUPTIONS, bench_barge_in
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.phone_line import PhoneLine
from voicepipe.bench.replay import spoken_at
from voicepipe.bench.room import RATE, Room, active_rms, at_snr, noise, overlay
from voicepipe.bench.room_cases import RoomCase
from voicepipe.bench.speakerphone import Loudspeaker
from voicepipe.bench.turn_set import espeak_audio
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.frontend.processing import AudioProcessing
from voicepipe.pipeline import CallConfig
from voicepipe.server import VoiceServer
from voicepipe.turns.own_voice import in_order

QUESTIONS = ["What is the capital of Italy?", "How many legs does a spider have?", "What colour is the sky?",
             "What do bees make?", "How many days are in a week?", "What is the capital of Japan?"]
INTERRUPTION = "Stop, tell me about cats instead."
# Asked before the interruption, and answered at length: a question answered in a word ("Rome.") had
# ended before the interruption a second into it, and an interruption of nothing counted as missed.
STORY = "Tell me a story about a dragon."
REPLIES = ["The capital of Italy is Rome.", "It is known for its ancient history and its food.",
           "A spider has eight legs.", "The sky is blue on a clear day.", "Bees make honey from the nectar of flowers.",
           "There are seven days in a week."]
BABBLE = ["The meeting starts at nine tomorrow morning.", "I think we should paint the kitchen blue.",
          "Have you seen the new film at the cinema?", "The train was late again this evening.",
          "She bought three apples and a loaf of bread.", "Turn left after the bridge and keep going."]
FRAME = RATE // 50
VOICE_RMS = 0.05  # the caller's voice at the microphone (-26 dBFS: room for echo 6 dB above it unclipped)


@dataclass
class Heard:
    """What one call of the bench saw, in microphone samples from its start."""

    spoken: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, text) the caller said
    events: list[tuple[int, dict]] = field(default_factory=list)  # (sample, server event)
    first_audio: list[int] = field(default_factory=list)  # samples at which a reply's first audio arrived
    mic: list[np.ndarray] = field(default_factory=list)
    far: list[np.ndarray] = field(default_factory=list)


def caller_noise(case: RoomCase, voices: list[np.ndarray]) -> np.ndarray | None:
    """Four minutes of the room's noise at its level in the microphone, or None in a quiet room."""
    return at_snr(noise(case.noise, 240.0, seed=7, voices=voices), VOICE_RMS, case.snr_db) if case.noise else None


class SpeakerphoneCaller:
    """One call: the microphone loop (voice + echo + noise, 20 ms at a time, in real time) and the reader."""

    def __init__(self, ws, case: RoomCase, reply_rms: float, voices: list[np.ndarray]) -> None:
        self.ws, self.case = ws, case
        # Where the room has no echo path the caller wears headphones: they play the reply all the same.
        self.speaker = Loudspeaker(case.room or Room(), VOICE_RMS, reply_rms, case.phone)
        self.line = PhoneLine(RATE) if case.phone else None  # what the caller's phone sends the server
        self.noise = caller_noise(case, voices)
        self.heard = Heard()
        self.sent = 0
        self._voice = np.zeros(0, np.float32)  # queued speech
        self._voice_at = 0
        self._rate = 22050
        self._awaiting_audio = False
        self._t0 = time.monotonic()

    def say(self, speech: np.ndarray, text: str) -> tuple[int, int]:
        start = max(self.sent, self._voice_at + len(self._voice))
        self._voice = np.concatenate([np.zeros(start - self._voice_at - len(self._voice), np.float32)
                                      if start > self._voice_at + len(self._voice) else np.zeros(0, np.float32),
                                      self._voice, speech * np.float32(VOICE_RMS / active_rms(speech))])
        self.heard.spoken.append((start, start + len(speech), text))
        self._awaiting_audio = True
        return start, start + len(speech)

    async def microphone(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._t0 + (self.sent + FRAME) / RATE - time.monotonic()))
            end = self.sent + FRAME
            mic = np.zeros(FRAME, np.float32)
            overlay(mic, self.sent, self._voice, self._voice_at)
            if self.case.room is not None:
                mic += self.speaker.echo(end, FRAME)
                self.heard.far.append(self.speaker.played[self.sent:end].copy())
            if self.noise is not None:
                mic += self.noise[self.sent % len(self.noise):][:FRAME]
            if self.line is not None:
                mic = self.line.process(mic)
            self.heard.mic.append(mic)
            await self.ws.send(to_pcm16(mic).tobytes())
            self.sent = end

    async def read(self) -> None:
        async for message in self.ws:
            if isinstance(message, bytes):
                if self._awaiting_audio:
                    self.heard.first_audio.append(self.sent)
                    self._awaiting_audio = False
                self.speaker.receive(np.frombuffer(message, "<i2"), self._rate, self.sent)
                continue
            event = json.loads(message)
            self.heard.events.append((self.sent, event))
            if event["type"] == "response.audio.delta":
                self._rate = event["sample_rate"]
            elif event["type"] == "output_audio_buffer.cleared":
                self.speaker.clear(self.sent)

    async def into_audio(self, seconds: float, ahead_s: float = 0.5, timeout_s: float = 10.0) -> bool:
        """Until the loudspeaker has played `seconds` of reply audio on end and holds `ahead_s` more (a reply
        may be a phrase, over in under a second; an interruption there has nothing to stop, and one begun as the
        phrase ends barges in after it). False where the reply never played so long: there is nothing to
        interrupt."""
        since, end = None, time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.speaker.playing(self.sent):
                since = None
            elif since is None:
                since = self.sent
            elif self.sent - since >= seconds * RATE and self.speaker.queue_end - self.sent >= ahead_s * RATE:
                return True
            await asyncio.sleep(FRAME / RATE)
        return False

    async def until(self, kind: str, after: int, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if any(at >= after and e["type"] == kind for at, e in self.heard.events):
                return True
            await asyncio.sleep(0.05)
        return False


async def run_case(url: str, case: RoomCase, front: bool, questions: list[np.ndarray],
                   interruption: tuple[np.ndarray, np.ndarray], reply_rms: float, voices: list[np.ndarray],
                   record: Path | None = None) -> dict:
    """One call's figures; with `record`, the caller's script (when they spoke and interrupted, and the
    figures) is written there as `<call id>.json`, beside the server's recording of the call."""
    async with websockets.connect(url, max_size=None) as ws:
        caller = SpeakerphoneCaller(ws, case, reply_rms, voices)
        tasks = [asyncio.create_task(caller.microphone()), asyncio.create_task(caller.read())]
        try:
            await ws.send(json.dumps({"type": "session.update", "session": {
                "echo_cancellation": front, "noise_reduction": {"type": "near_field"} if front else None,
                "turn_detection": {"type": "server_vad"}}}))
            await asyncio.sleep(1.0)
            onsets = []
            for i, (speech, text) in enumerate(zip(questions, QUESTIONS, strict=True)):
                _, end = caller.say(speech, text)
                await caller.until("response.done", end, 25.0)
                if i == 3:  # a real interruption: over the next reply, a second into its audio
                    story, stop = interruption
                    _, end = caller.say(story, STORY)
                    await caller.until("response.audio.delta", end, 15.0)
                    if await caller.into_audio(1.0):  # (a story told in a phrase is not interrupted)
                        start, end = caller.say(stop, INTERRUPTION)
                        onsets.append(start)
                        await caller.until("response.done", end, 25.0)
                await asyncio.sleep(2.0)  # the echo's tail, and a pause before the next question
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    result = figures(caller.heard, onsets, front)
    if record is not None and front:  # (a front end off records nothing)
        call = next(e["session"]["id"] for _, e in caller.heard.events if e["type"] == "session.created")
        script = {"room": case.name, "front": front, "spoken": caller.heard.spoken, "onsets": onsets,
                  "figures": result}
        (record / f"{call}.json").write_text(json.dumps(script))
    return result


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(said: str, heard: str) -> tuple[int, int]:
    """Word-level edit distance and the length of `said`."""
    a, b = words(said), words(heard)
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1], len(a)


def holds(transcript: str, said: str) -> bool:
    """Whether `transcript` holds `said`, but for at most a third of its words, among words of its own."""
    expected = words(said)
    return in_order(expected, words(transcript)) >= len(expected) - len(expected) // 3


def figures(h: Heard, onsets: list[int], front: bool) -> dict:
    """A call's figures from what its caller heard and said (a websocket's caller or `talk`'s listener)."""
    spoken = h.spoken
    starts = [at for at, e in h.events if e["type"] == "input_audio_buffer.speech_started"]
    transcripts = [(at, e["transcript"], e.get("item_id")) for at, e in h.events
                   if e["type"] == "conversation.item.input_audio_transcription.completed"]
    began = {e["item_id"]: e["audio_start_ms"] * RATE // 1000 for _, e in h.events
             if e["type"] == "input_audio_buffer.speech_started" and "audio_start_ms" in e}

    def in_words(start: int) -> bool:
        """Whether an utterance the VAD began at `start` (its padding half a second at most before the first
        word) began within the caller's words."""
        return any(s[0] - RATE // 2 <= start <= s[1] for s in spoken)

    def phantom(at: int, item_id: str | None, text: str) -> bool:
        """Whether an utterance began while the caller was silent (the VAD's start, with its padding, at most
        half a second before their first word and no later than their last) and is not their words (begun
        on the echo's tail, an utterance may run on into the question that follows, and be heard as it);
        where the start is not told, whether its transcript came more than 3 s after the caller's last
        word. (Counted where it has words: one of none is no turn.)"""
        if item_id in began:
            start = began[item_id]
            return not (in_words(start) or any(start <= s[0] <= at and holds(text, s[2]) for s in spoken))
        return not spoken_at(spoken, at, 3 * RATE)

    cleared = [at for at, e in h.events if e["type"] == "output_audio_buffer.cleared"]
    created = [at for at, e in h.events if e["type"] == "response.created"]
    # A question whose turn the server ended before the caller's last word: a reply begun while they spoke.
    cut = [s for s in spoken if s[2] != INTERRUPTION and any(s[0] < c < s[1] for c in created)]
    errors = total = heard = 0
    for start, end, text in spoken:
        if text == INTERRUPTION:
            continue
        said = " ".join(t for at, t, _ in transcripts if start <= at <= end + 3 * RATE)
        e, n = word_errors(text, said)
        errors, total = errors + min(e, n), total + n
        heard += e <= n // 3
    caught = [next((c - o for c in cleared if o <= c <= o + 2 * RATE), None) for o in onsets]
    ttfa = []
    for _, end, _ in spoken:
        first = next((a for a in h.first_audio if a > end), None)
        if first is not None and first - end < 10 * RATE:
            ttfa.append((first - end) / RATE)
    cpu = front_end_cpu(h) if h.far else None
    false = [c for c in cleared if not spoken_at(spoken, c, RATE // 2)]

    def answered(at: int, start: int) -> bool:
        """Whether a reply began after a transcript that came at `at`, of an utterance begun at `start`,
        before the caller next spoke after that start."""
        after = min((s[0] for s in spoken if s[0] > start), default=None)
        return any(at <= c and (after is None or c < after) for c in created)

    # Utterances the server took for its own voice or a sound over it and dropped: the caller's words lost
    # where one began while they spoke.
    dropped = [(e, began.get(e.get("item_id"), at)) for at, e in h.events
               if e["type"] == "conversation.item.deleted" and "reason" in e]
    lost = [{**placed(h, start), "transcript": e["transcript"], "reason": e["reason"]} for e, start in dropped
            if in_words(start)]
    phantoms = [{**placed(h, began.get(item_id, at)), "transcript": text,
                 "answered": answered(at, began.get(item_id, at))}
                for at, text, item_id in transcripts if words(text) and phantom(at, item_id, text)]
    return {"questions": sum(1 for s in spoken if s[2] != INTERRUPTION), "heard": heard, "utterances": len(spoken),
            "word_error": errors / max(1, total), "word_errors": errors, "words": total,
            "replies": len(created), "questions_cut": len(cut),
            "false_barge_ins": len(false), "false_barge_in_at": [placed(h, at) for at in false],
            "phantom_transcripts": len(phantoms), "phantom_at": phantoms,
            "replies_to_own_voice": sum(1 for p in phantoms if p["answered"]),
            "dropped": len(dropped), "callers_words_dropped": len(lost), "callers_words_dropped_at": lost,
            "speech_started_while_silent": sum(1 for s in starts if not spoken_at(spoken, s, 0)),
            "interruptions_caught_300ms": sum(1 for c in caught if c is not None and c <= 0.3 * RATE),
            "interruptions": len(onsets),
            "interruption_stop_s": [None if c is None else c / RATE for c in caught],
            "first_audio_s": ttfa, "first_audio_p50_s": percentile(ttfa, 50) if ttfa else None,
            "front_end": front, "front_end_cpu_ms_per_s": cpu}


def placed(h: Heard, at: int) -> dict:
    """Where something came (seconds into the call and into the latest reply's audio, which reply) and the
    front end as the call's last stats before it showed it (which canceller's output the call heard)."""
    created = [a for a, e in h.events if e["type"] == "response.created" and a <= at]
    audio = [a for a in h.first_audio if a <= at]
    state = next((e["stats"]["audio_input"] for a, e in reversed(h.events)
                  if a <= at and e["type"] == "scheduler.stats" and "audio_input" in e["stats"]), None)
    return {"at_s": at / RATE, "reply": len(created),
            "into_reply_audio_s": (at - audio[-1]) / RATE if audio else None,
            "canceller": None if state is None else state["canceller"],
            "echo_return_loss_enhancement_db": None if state is None else state["echo_return_loss_enhancement_db"]}


def merged(calls: list[dict]) -> dict:
    """One room's figures over several calls: counts summed, word error over all words, first audio's p50
    over every reply, false barge-ins per 100 replies; each call's own figures under "calls"."""
    total = {key: sum(c[key] for c in calls) for key in (
        "questions", "heard", "utterances", "word_errors", "words", "replies", "questions_cut", "false_barge_ins",
        "replies_to_own_voice", "phantom_transcripts", "dropped", "callers_words_dropped",
        "speech_started_while_silent", "interruptions_caught_300ms", "interruptions")}
    ttfa = [t for c in calls for t in c["first_audio_s"]]
    cpu = [c["front_end_cpu_ms_per_s"] for c in calls if c["front_end_cpu_ms_per_s"] is not None]
    return {**total, "word_error": total["word_errors"] / max(1, total["words"]),
            "false_barge_ins_per_100_replies": 100 * total["false_barge_ins"] / max(1, total["replies"]),
            "false_barge_in_at": [f for c in calls for f in c["false_barge_in_at"]],
            "phantom_at": [f for c in calls for f in c["phantom_at"]],
            "callers_words_dropped_at": [f for c in calls for f in c["callers_words_dropped_at"]],
            "interruption_stop_s": [s for c in calls for s in c["interruption_stop_s"]],
            "first_audio_p50_s": percentile(ttfa, 50) if ttfa else None, "front_end": calls[0]["front_end"],
            "front_end_cpu_ms_per_s": sum(cpu) / len(cpu) if cpu else None, "calls": calls}


def front_end_cpu(h: Heard) -> float:
    """The front end's CPU time per second of audio, run over the call's microphone and loudspeaker."""
    mic, far = np.concatenate(h.mic), np.concatenate([np.pad(f, (0, FRAME - len(f))) for f in h.far])
    processing = AudioProcessing(echo=True, noise="near_field")
    t0 = time.thread_time()
    for i in range(0, len(mic), FRAME):
        processing.process(mic[i:i + FRAME], far[i:i + FRAME])
    return (time.thread_time() - t0) / (len(mic) / RATE) * 1000


async def bench_room(runtime: Runtime, cases: list[RoomCase], reply_sentences: list[np.ndarray],
                     tries: int, calls: int = 1, fronts: tuple[bool, ...] = (True, False),
                     record: Path | None = None) -> dict:
    """The calls of each room and front-end setting, then the interruption tries; with `record`, each call's
    recording (the server's) and script (the caller's) are written there, for `bench replay`."""
    questions = [espeak_audio("en-us", q) for q in QUESTIONS]
    interruption = espeak_audio("en-us", STORY), espeak_audio("en-us", INTERRUPTION)
    voices = [espeak_audio(v, s) for v in ("en-gb", "en+f3", "en-us") for s in BABBLE]
    reply_rms = active_rms(np.concatenate(reply_sentences))
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
    config = CallConfig(record_front_end=None if record is None else str(record))
    server = VoiceServer(runtime, Limits(max_calls=1), call_config=config)
    await server.start("127.0.0.1", 0)
    report: dict = {"cases": {}}
    try:
        url = f"ws://127.0.0.1:{server.port}/ws"
        for case in cases:
            for front in fronts:
                results = [await run_case(url, case, front, questions, interruption, reply_rms, voices, record)
                           for _ in range(calls)]
                report["cases"].setdefault(case.name, {})["on" if front else "off"] = merged(results)
    finally:
        await server.close()
    if tries:
        speakers = [espeak_audio(v, s) for v in ("en-us", "en-gb", "en+f3") for s in INTERRUPTIONS]
        rooms = [(c.name, c.room, caller_noise(c, voices), c.phone) for c in cases]
        report["barge_in"] = await asyncio.to_thread(bench_barge_in, rooms, reply_sentences, speakers, VOICE_RMS,
                                                     reply_rms, 2 * tries)
    return report


def reply_sentences_of(options) -> list[np.ndarray]:
    """The assistant's voice (Piper's, or the chosen TTS's) saying replies like the questions', at 16 kHz."""
    from voicepipe.audio import resample
    from voicepipe.backends.tts_select import make_tts

    tts = make_tts(options.tts, options.tts_model)
    return [resample(np.concatenate(list(tts.synthesize(text))).astype(np.float32) / 32768.0, tts.sample_rate, RATE)
            for text in REPLIES]


def print_barge_in(report: dict) -> None:
    """The interruptions table: many tries per room, through the front end and the VAD alone."""
    print(f"\n{'interruptions over the room':34} {'front end':9} {'caught <=300 ms':>15} {'p50':>7} {'p95':>7} "
          f"{'missed':>6} {'false b-i per 100 replies':>25}")
    for name, runs in report.items():
        for which, r in runs.items():
            p50, p95 = (f"{x:.2f} s" if x is not None else "-" for x in (r["barge_in_p50_s"], r["barge_in_p95_s"]))
            print(f"{name:34} {which:9} {r['caught_300ms']:>9}/{r['interruptions']:<5} {p50:>7} {p95:>7} "
                  f"{r['missed']:>6} {r['false_barge_ins_per_100_replies']:>25.1f}")


def print_room(report: dict) -> None:
    print(f"{'room':34} {'front end':9} {'heard':>7} {'WER':>5} {'replies':>8} {'cut':>3} {'false b-i':>9} "
          f"{'per 100':>7} {'phantom':>7} {'answered':>8} {'dropped':>7} {'interrupt':>9} {'first audio':>11} "
          f"{'CPU ms/s':>8}")
    for name, runs in report["cases"].items():
        for which, r in runs.items():
            fa = "-" if r["first_audio_p50_s"] is None else f"{r['first_audio_p50_s']:.2f} s"
            cpu = "-" if r["front_end_cpu_ms_per_s"] is None else f"{r['front_end_cpu_ms_per_s']:.1f}"
            per_100 = 100 * r["false_barge_ins"] / max(1, r["replies"])
            print(f"{name:34} {which:9} {r['heard']:>3}/{r['questions']:<3} {r['word_error']:5.2f} "
                  f"{r['replies']:>4}/{r['utterances']:<3} {r['questions_cut']:>3} {r['false_barge_ins']:>9} "
                  f"{per_100:>7.1f} {r['phantom_transcripts']:>7} {r['replies_to_own_voice']:>8} {r['dropped']:>7} "
                  f"{r['interruptions_caught_300ms']:>7}/{r['interruptions']:<1} "
                  f"{fa:>11} {cpu:>8}")
    for name, runs in report["cases"].items():
        for which, r in runs.items():
            for what, key in (("false barge-in", "false_barge_in_at"), ("phantom", "phantom_at"),
                              ("the caller's words dropped", "callers_words_dropped_at")):
                for f in r[key]:
                    into = "-" if f["into_reply_audio_s"] is None else f"{f['into_reply_audio_s']:.2f} s"
                    heard = f' "{f["transcript"]}"' if "transcript" in f else ""
                    heard += "" if "answered" not in f else " (answered)" if f["answered"] else " (not answered)"
                    print(f"{what}{heard}, {name} ({which}): {f['at_s']:.1f} s into the call, reply {f['reply']}, "
                          f"{into} into its audio; the call heard {f['canceller']}'s output "
                          f"({f['echo_return_loss_enhancement_db']} dB of echo removed)")
