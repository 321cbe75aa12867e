"""`voicepipe bench talk`: `talk`'s own call (`voicepipe.local.talk`) with its loudspeaker heard by its
microphone, through a sound server and a synthetic room, as on a laptop without headphones.

The sound card is a PulseAudio server of the bench's own (`voicepipe.bench.sound_server`): talk plays into
its `speaker` sink and records the `mic` sink's monitor through PortAudio, as it would a sound card. Between
them the air is a stand-in, as in `bench room` (no loudspeaker or microphone can exist here): `parec` reads
what the speaker played, 20 ms at a time, the room's impulse response and level turn it into the echo, the
caller's voice (espeak-ng) and the microphone's noise are added, and `pacat` plays that into `mic`. So talk
knows only what its speaker callback played and when; the sound server's buffers both ways and the room's
delay are unknown to it, as a sound card's and a room's are. Reported per room, as `bench room` reports a
websocket call, with the positions those of the room's own stream.
"""

import asyncio
import io
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from voicepipe.audio import to_pcm16
from voicepipe.bench.room import RATE, active_rms, overlay
from voicepipe.bench.room_bench import (
    BABBLE,
    INTERRUPTION,
    QUESTIONS,
    STORY,
    VOICE_RMS,
    Heard,
    caller_noise,
    figures,
)
from voicepipe.bench.room_cases import RoomCase
from voicepipe.bench.sound_server import sound_server
from voicepipe.bench.speakerphone import SELF_NOISE, Loudspeaker
from voicepipe.bench.turn_set import espeak_audio
from voicepipe.call.runtime import Runtime
from voicepipe.local.devices import find_devices
from voicepipe.local.talk import LocalCall
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.events import Event, ResponseCreated, SpeechStarted, TranscriptFinal, UtteranceDropped
from voicepipe.pipeline.outbound import AudioSent, PlaybackCleared

BLOCK = RATE // 50  # the room's step: 20 ms
PULSE_FORMAT = [f"--rate={RATE}", "--channels=1", "--format=s16le"]
# What the air plays into the microphone waits this long in the sound server: with 20 ms there, the air's
# process, held up by the call's work on the same cores, ran dry 5-6 times a minute and the sound server
# filled each gap with silence, moving the echo and the caller 1-6 ms later each time (measured: noise bursts
# through the air beside three busy processes); with 100 ms, none in a minute, the delay steady to 0.1 ms.
# The price is ~40 ms more between the caller's mouth and talk's microphone, in every figure that starts there.
MIC_LATENCY = "--latency-msec=100"
AIR_NICE = -10
SPEAKER_LATENCY = "--latency-msec=20"
# The call's events as `bench room` reads them off the wire, so one set of figures serves both.
WIRE = {SpeechStarted: "input_audio_buffer.speech_started", PlaybackCleared: "output_audio_buffer.cleared",
        ResponseCreated: "response.created",
        TranscriptFinal: "conversation.item.input_audio_transcription.completed",
        UtteranceDropped: "conversation.item.deleted"}


class Air:
    """The room between talk's speaker and its microphone: what the speaker played in, the microphone's audio
    out, at the sound server's pace, in a process of its own (`breathe`). On a thread of the call's process
    it waited on the call's work now and then, the sound server's buffer ran dry, and the echo's delay
    jumped by 15 ms mid-call: no room does that."""

    def __init__(self, case: RoomCase, reply_rms: float, voices: list[np.ndarray]) -> None:
        context = multiprocessing.get_context("spawn")  # the call's process has threads: no fork
        self.heard = Heard()
        self._position, self._last_played = context.Value("q", 0), context.Value("q", 0)
        self._said, self._stop = context.SimpleQueue(), context.Event()
        self._voice_end = 0
        self._process = context.Process(target=breathe, name="air", daemon=True, args=(
            case, reply_rms, voices, self._position, self._last_played, self._said, self._stop))
        self._process.start()

    @property
    def position(self) -> int:
        """Samples of the microphone's stream mixed so far."""
        return self._position.value

    @property
    def last_played(self) -> int:
        """Where in the microphone's stream the speaker last played anything."""
        return self._last_played.value

    async def breathing(self, timeout_s: float = 30.0) -> None:
        """Until the air has played a quarter of a second into the microphone. A microphone records the room's
        noise from its first sample; the microphone's sink sends digital silence until then, and a call that
        hears that from a microphone takes it for a client that gates its own input (`EchoPath`): it judged
        the loudspeaker not heard, and the first reply's echo went to the VAD uncancelled."""
        for _ in range(int(timeout_s / 0.05)):
            if self.position >= RATE // 4:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("the air's process did not start")

    def say(self, speech: np.ndarray, text: str) -> tuple[int, int]:
        """The caller says `speech` a block or two from now: its (start, end) in the microphone's stream."""
        start = max(self.position + 2 * BLOCK, self._voice_end)
        self._said.put((start, speech * np.float32(VOICE_RMS / active_rms(speech))))
        self._voice_end = start + len(speech)
        self.heard.spoken.append((start, self._voice_end, text))
        return start, self._voice_end

    def close(self) -> None:
        self._stop.set()
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()


def breathe(case: RoomCase, reply_rms: float, voices: list[np.ndarray], position, last_played, said,
            stop) -> None:
    """The air's process: 20 ms of what the speaker played (`parec`) in, 20 ms of the microphone (`pacat`)
    out: the echo through the room, with the microphone's own noise, the caller's voice and the room's noise.
    It asks for a higher priority than the call's: at the call's own, the models' work on the same cores held
    it up for seconds at a time, and no room waits for a process."""
    try:
        os.nice(AIR_NICE)
    except PermissionError:
        print("bench talk: the air could not raise its priority (needs CAP_SYS_NICE): where the call's work holds "
              "it up, the echo and the caller arrive late", file=sys.stderr)
    speaker = Loudspeaker(case.room, VOICE_RMS, reply_rms) if case.room else None
    noise = caller_noise(case, voices)
    hiss = np.random.default_rng(0).standard_normal(RATE).astype(np.float32) * SELF_NOISE
    recorder = subprocess.Popen(["parec", "-d", "speaker.monitor", *PULSE_FORMAT, SPEAKER_LATENCY],
                                stdout=subprocess.PIPE)
    player = subprocess.Popen(["pacat", "-d", "mic", *PULSE_FORMAT, MIC_LATENCY], stdin=subprocess.PIPE)
    speech: list[tuple[int, np.ndarray]] = []  # (where it starts, the caller's voice)
    start = 0
    try:
        while not stop.is_set() and len(data := recorder.stdout.read(2 * BLOCK)) == 2 * BLOCK:
            while not said.empty():
                speech.append(said.get())
            played, end = np.frombuffer(data, "<i2"), start + BLOCK
            mic = np.resize(np.roll(hiss, -start % RATE), BLOCK)
            if speaker is not None:
                speaker.receive(played, RATE, start)
                mic = speaker.echo(end, BLOCK)  # with the microphone's own noise
            for at, voice in speech:
                overlay(mic, start, voice, at)
            speech = [(at, voice) for at, voice in speech if at + len(voice) > end]
            if noise is not None:
                mic += noise[start % len(noise):][:BLOCK]
            player.stdin.write(to_pcm16(mic).tobytes())
            player.stdin.flush()
            if np.any(played):
                last_played.value = end
            position.value = start = end
    except BrokenPipeError:
        pass
    finally:
        recorder.terminate()
        player.terminate()
        recorder.wait(10)
        player.wait(10)


class Listener:
    """The call's events as talk's line receives them, each at the microphone stream's position."""

    def __init__(self, call: LocalCall, air: Air) -> None:
        self.air, self.heard = air, air.heard
        self._awaiting_audio = False
        send = call.line.send

        async def noted(event: Event) -> None:
            self.note(event)
            await send(event)

        call.line.send = noted

    def note(self, event: Event) -> None:
        at, heard = self.air.position, self.heard
        if isinstance(event, AudioSent) and self._awaiting_audio:
            heard.first_audio.append(at)
            self._awaiting_audio = False
        kind = WIRE.get(type(event))
        if kind is None:
            return
        self._awaiting_audio |= isinstance(event, ResponseCreated)
        body: dict = {"type": kind}
        if isinstance(event, TranscriptFinal | UtteranceDropped):
            body["transcript"] = event.text
        if isinstance(event, UtteranceDropped):
            body["reason"] = event.reason
        heard.events.append((at, body))

    async def playing_after(self, at: int, timeout_s: float = 20.0) -> bool:
        """Until the speaker plays something after stream position `at`."""
        for _ in range(int(timeout_s / 0.05)):
            if self.air.last_played > at:
                return True
            await asyncio.sleep(0.05)
        return False

    async def settled(self, quiet_s: float = 1.5, timeout_s: float = 60.0) -> None:
        """Until the speaker has been silent `quiet_s`."""
        for _ in range(int(timeout_s / 0.05)):
            if self.air.position - self.air.last_played > quiet_s * RATE:
                return
            await asyncio.sleep(0.05)


async def run_room(runtime: Runtime, case: RoomCase, echo: bool, questions: list[np.ndarray], story: np.ndarray,
                   interruption: np.ndarray, reply_rms: float, voices: list[np.ndarray]) -> dict:
    """One call in `case`: the questions one at a time, each once the last reply has played out, and after
    every other one a story asked for and interrupted 1.5 s into its audio; then the figures."""
    devices = find_devices()
    call = LocalCall(runtime, devices, out=io.StringIO(), config=CallConfig(echo_cancellation=echo))
    air = Air(case, reply_rms, voices)
    listener = Listener(call, air)
    await air.breathing()
    running = asyncio.create_task(call.run())
    onsets = []
    try:
        await asyncio.sleep(2.0)  # the streams open, and the room's noise is heard a while
        for i, (speech, text) in enumerate(zip(questions, QUESTIONS, strict=True)):
            _, end = air.say(speech, text)
            await listener.playing_after(end)
            await listener.settled()
            if i % 2:  # a long reply, interrupted
                _, end = air.say(story, STORY)
                if await listener.playing_after(end):
                    await asyncio.sleep(1.5)
                    start, end = air.say(interruption, INTERRUPTION)
                    onsets.append(start)
                    await listener.playing_after(end)  # the reply to the interruption
                await listener.settled()
    finally:
        await call.hang_up()
        await asyncio.wait_for(running, 60)
        air.close()
    front = call.line.front.processing
    result = figures(listener.heard, onsets, echo)
    lag = front.path.lag if echo else None
    result.update(canceller=front.canceller, judged_lag_ms=None if lag is None else 10 * lag,
                  room_delay_ms=case.room.delay_ms if case.room else None)
    return result


async def bench_talk(runtime: Runtime, cases: list[RoomCase], reply_sentences: list[np.ndarray],
                     off: bool) -> dict:
    """Every room with the call's canceller on (and off, with `off`), on a sound server of the bench's own."""
    questions = [espeak_audio("en-us", q) for q in QUESTIONS]
    story, interruption = espeak_audio("en-us", STORY), espeak_audio("en-us", INTERRUPTION)
    voices = [espeak_audio(v, s) for v in ("en-gb", "en+f3", "en-us") for s in BABBLE]
    reply_rms = active_rms(np.concatenate(reply_sentences))
    report: dict = {"cases": {}}
    with tempfile.TemporaryDirectory() as folder, sound_server(Path(folder)):
        for case in cases:
            for echo in (True, False) if off else (True,):
                result = await run_room(runtime, case, echo, questions, story, interruption, reply_rms, voices)
                report["cases"].setdefault(case.name, {})["on" if echo else "off"] = result
    return report
