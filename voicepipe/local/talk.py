"""`voicepipe talk`: one call through this machine's microphone and speakers instead of a websocket.

The call is an ordinary `Session`, with the pipeline, barge-in and events of a websocket call; a
`LocalLine` stands in for the websocket (in this process, it reads the session's events as they are, with
no wire format between). What the microphone hears is what the line receives; the events the session sends
are printed as they stream, and the reply audio goes into a ring buffer that the
speaker's callback drains. Both callbacks run on PortAudio's threads and only copy and resample samples.

Both streams run at their device's own rate, resampled here to and from the call's rates, so no device
has to support 16 kHz or the voice's rate. The microphone also hears the assistant through the speakers:
the call's echo canceller takes that out, its far end fed by the speaker's callback with exactly what it
played and when (no guessing from a playback clock).
"""

import asyncio
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from time import monotonic
from typing import Any, TextIO

import numpy as np
import soxr

from voicepipe.audio import SAMPLE_RATE
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.frontend.reference import StreamClock
from voicepipe.frontend.stage import AudioFrontEnd
from voicepipe.local.devices import Devices, NoAudioDevice, portaudio
from voicepipe.local.playback import PlaybackBuffer
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.events import Error, Event, ResponseCreated, TextDelta, TranscriptFinal
from voicepipe.pipeline.outbound import AudioEnded, AudioSent, PlaybackCleared, ResponseDone, SessionDescribed
from voicepipe.protocol.transport import Disconnected

FRAME_S = 0.02  # microphone frames of 20 ms, as the browser client sends them
PLAYBACK_S = 120.0  # room for more than the longest reply: synthesis runs well ahead of playback
LATENCY_CALLBACKS = 20  # the output latency is taken from the first callbacks' reports, then held
TAIL_CALLBACKS = 8  # the speaker's callbacks of silence after a reply still given to the canceller


class Resampler:
    """PCM16 resampling that keeps its filter's state from one chunk to the next: resampling each 20 ms
    frame on its own would click at every frame's edge."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self._stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="int16") if from_rate != to_rate else None

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        return pcm if self._stream is None else self._stream.resample_chunk(pcm)

    def flush(self) -> np.ndarray:
        """The end of a stretch of audio: the samples the filter still holds; the next call starts afresh."""
        if self._stream is None:
            return np.zeros(0, np.int16)
        tail = self._stream.resample_chunk(np.zeros(0, np.int16), last=True)
        self._stream.clear()
        return tail

    def clear(self) -> None:
        """Forget the audio the filter holds."""
        if self._stream is not None:
            self._stream.clear()


class LocalLine:
    """The session's transport for a local call: microphone frames in; events printed, reply audio played.

    Made on the event loop the session runs on, which the microphone's callback hands its frames to.
    """

    def __init__(self, devices: Devices, reply_rate: int, out: TextIO, front: AudioFrontEnd | None = None) -> None:
        self.out, self.front = out, front
        self.playback = PlaybackBuffer(int(PLAYBACK_S * devices.output_rate))
        self._loop = asyncio.get_running_loop()
        self._incoming: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._from_mic = Resampler(devices.input_rate, SAMPLE_RATE)
        self._to_speaker = Resampler(reply_rate, devices.output_rate)
        self._to_reference = Resampler(devices.output_rate, SAMPLE_RATE)
        self._position = 0  # samples of the speaker's stream so far (the PortAudio thread's)
        self._speaker_clock = StreamClock(devices.output_rate)
        self._latencies: list[float] = []  # the output latency PortAudio reported in the first callbacks
        self._latency = 0.0  # ...their median, fixed once they are all in
        self._after = 0  # callbacks still to report after the last one that played anything
        self._reference_position = 0  # the speaker's sample the reference's stream starts at
        self._reference_given = 0  # samples the reference's resampler has given since
        self._midline = False  # a reply is being printed as it streams
        self._recorded = 0  # microphone samples (at the call's rate) handed to the call so far

    # -- the sound devices' callbacks (PortAudio's threads) ---------------------------------------------------
    def microphone(self, indata: np.ndarray, frames: int, time: Any, status: Any) -> None:
        """Hand the frame to the call, with the time by which it had been recorded: now. (PortAudio's own
        time at the ADC, through ALSA's pulse plugin, was measured wrong by up to 0.57 s; the callbacks' times
        less the samples they brought held within a millisecond over 20 s.)"""
        now = monotonic()
        pcm = self._from_mic(indata[:, 0].copy())
        if not len(pcm):
            return
        position, self._recorded = self._recorded, self._recorded + len(pcm)
        try:
            self._loop.call_soon_threadsafe(self._heard, pcm.astype("<i2", copy=False).tobytes(), position, now)
        except RuntimeError:
            pass  # the call's loop has closed: the microphone is no longer heard

    def _heard(self, frame: bytes, position: int, at: float) -> None:
        """On the call's loop: the echo canceller learns when the frame was recorded, then the call hears it."""
        if self.front is not None:
            self.front.recorded(position, len(frame) // 2, at)
        self._incoming.put_nowait(frame)

    def speaker(self, outdata: np.ndarray, frames: int, time: Any, status: Any) -> None:
        """Play the next samples, and give the echo canceller exactly what was played and when: on the
        speaker stream's own clock (`StreamClock`: its samples are its clock), plus the output's latency
        (PortAudio's time at the DAC less its time now, as first reported). Timed by each callback alone, a
        reply's start moved with that callback's lateness, and the echo with it, every reply.

        The reference is the speaker's whole stream resampled as one, silences included, from the stream's
        start (or its last underrun): each 9 ms piece resampled on its own left an edge at every piece, and a
        resampler started again for each reply put each reply's samples on a grid of its own, a fraction of
        a sample off the last one's (white noise came out with an error 2-5 dB under its own level, against 26
        dB where a reply happened to fall on the first's grid), which a linear canceller takes for a new room.
        Only the stretches that played something, and the silence just after (so the resampler gives back the
        reply's last milliseconds), are handed to the call."""
        played = self.playback.read_into(outdata[:, 0])
        position, self._position = self._position, self._position + frames
        if status and status.output_underflow:  # the card played silence meanwhile: the stream broke there
            self._speaker_clock.restart()
            self._to_reference.clear()
            self._reference_position, self._reference_given = position, 0
        self._speaker_clock.seen(position, monotonic())
        if len(self._latencies) < LATENCY_CALLBACKS:
            self._latencies.append(max(0.0, time.outputBufferDacTime - time.currentTime))
            self._latency = float(np.median(self._latencies))
        if self.front is None:
            return
        reference = self._to_reference(outdata[:, 0])
        given, self._reference_given = self._reference_given, self._reference_given + len(reference)
        self._after = TAIL_CALLBACKS if played else max(0, self._after - 1)
        if len(reference) and (played or self._after):
            start = self._speaker_clock.time(self._reference_position) + given / SAMPLE_RATE + self._latency
            try:
                self._loop.call_soon_threadsafe(self.front.played, reference, SAMPLE_RATE, start)
            except RuntimeError:
                pass  # the call's loop has closed

    # -- the Transport the session talks to ------------------------------------------------------------------
    async def recv(self) -> bytes:
        frame = await self._incoming.get()
        if frame is None:
            raise Disconnected()
        return frame

    async def send(self, event: Event) -> None:
        if isinstance(event, AudioSent):
            self.playback.write(self._to_speaker(event.pcm))
        else:
            self.show(event)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self._incoming.put_nowait(None)

    # -- the terminal ----------------------------------------------------------------------------------------
    def show(self, event: Event) -> None:
        """Act on one event of the session's: print what was heard and answered, drop audio on a barge-in."""
        if isinstance(event, PlaybackCleared):
            self.playback.clear()
            self._to_speaker.clear()
        elif isinstance(event, AudioEnded):
            self.playback.write(self._to_speaker.flush())
        elif isinstance(event, SessionDescribed) and event.created:
            self._print("voicepipe: listening; speak to the assistant (Ctrl+C ends the call)")
        elif isinstance(event, TranscriptFinal):
            self._print(f"you: {event.text.strip()}")
        elif isinstance(event, ResponseCreated):
            self._print("assistant: ", end="")
        elif isinstance(event, TextDelta):
            self._write(event.text.replace("\n", " "))  # a reply stays on its line
        elif isinstance(event, ResponseDone) and self._midline:
            self._write(" [interrupted]\n" if event.status == "cancelled" else "\n")
            self._midline = False
        elif isinstance(event, Error):
            print(f"voicepipe: {event.message}", file=sys.stderr, flush=True)

    def _print(self, text: str, end: str = "\n") -> None:
        """Write `text` on a line of its own (ending a reply that is still streaming)."""
        self._write(("\n" if self._midline else "") + text + end)
        self._midline = not end

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


class LocalCall:
    """A session over the local sound devices; made on the event loop it runs on."""

    def __init__(self, runtime: Runtime, devices: Devices, out: TextIO = sys.stdout,
                 config: CallConfig | None = None) -> None:
        self.devices = devices
        config = config or CallConfig()
        front = AudioFrontEnd(config, own_far_end=True)  # the speaker's callback says what it played, and when
        self.line = LocalLine(devices, runtime.tts_rate, out, front)
        self.session = Session(self.line, runtime, Limits(), config, front=front)

    async def run(self) -> None:
        """Hold the call until it is hung up or cancelled."""
        with self._streams():
            await self.session.run()

    async def hang_up(self) -> None:
        await self.line.close()

    @contextmanager
    def _streams(self) -> Iterator[None]:
        sd, devices, line = portaudio(), self.devices, self.line
        with ExitStack() as streams:
            try:
                streams.enter_context(sd.InputStream(
                    device=devices.input, samplerate=devices.input_rate, channels=1, dtype="int16",
                    blocksize=int(FRAME_S * devices.input_rate), callback=line.microphone))
                streams.enter_context(sd.OutputStream(
                    device=devices.output, samplerate=devices.output_rate, channels=1, dtype="int16",
                    callback=line.speaker))
            except (sd.PortAudioError, ValueError) as e:
                raise NoAudioDevice(e) from None
            yield


async def talk(runtime: Runtime, devices: Devices, config: CallConfig | None = None) -> None:
    """Warm the models up, then hold one call until interrupted.

    The engine is stopped while this event loop still runs, so the aborts of the call's requests find a
    loop to report to (as `run_server` does).
    """
    try:
        await LocalCall(runtime, devices, config=config).run()
    finally:
        await runtime.close()
