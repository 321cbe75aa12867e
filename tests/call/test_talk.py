"""`voicepipe talk` through real PortAudio devices, and its message when there are none.

A PulseAudio server of the test's own is the sound card (`voicepipe/bench/sound_server.py`): the test
plays espeak-ng speech into the sink `mic`, whose monitor is the default source talk records from, and
records the default sink `speaker`, where talk plays, through its monitor. So the audio crosses PortAudio
both ways in real time, as a microphone's and a loudspeaker's would.
"""

import asyncio
import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from support.helpers import QUESTION, TURN_TIMEOUT_S

from voicepipe.audio import to_float32
from voicepipe.backends.loading import ASR_PARTIAL
from voicepipe.bench import sound_server
from voicepipe.call.runtime import Runtime
from voicepipe.local.devices import Devices, find_devices
from voicepipe.local.playback import PlaybackBuffer
from voicepipe.local.talk import LocalCall

RATE = 16000  # of the recording of the speaker
STORY = "Tell me a story about a dragon."  # heard well through the sound server, and answered at length
needs_pulse = pytest.mark.skipif(
    not sound_server.available(),
    reason="PulseAudio is not installed (Debian: pulseaudio pulseaudio-utils libasound2-plugins)")


@pytest.fixture(scope="module")
def pulse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PulseAudio server; its address is in PULSE_SERVER while this module's tests run."""
    with sound_server.sound_server(tmp_path_factory.mktemp("pulse")) as server:
        yield server


@pytest.fixture(scope="module")
def devices(pulse: str) -> Devices:
    return find_devices()


class Recording:
    """What reaches the speaker, recorded from its monitor as 16 kHz PCM16 by parec."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def position(self) -> int:
        return self.path.stat().st_size // 2

    def audio(self, start: int, end: int) -> np.ndarray:
        return to_float32(np.fromfile(self.path, "<i2", count=end)[max(0, start):])


@pytest.fixture(scope="module")
def recording(pulse: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    path = tmp_path_factory.mktemp("speaker") / "speaker.raw"
    with path.open("wb") as file:
        recorder = subprocess.Popen(["parec", "-d", "speaker.monitor", f"--rate={RATE}", "--channels=1",
                                     "--format=s16le", "--latency-msec=20"], stdout=file)
    try:
        yield Recording(path)
    finally:
        recorder.terminate()
        recorder.wait(30)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def call(runtime: Runtime, devices: Devices, recording: Recording):
    """`voicepipe talk`'s call, on this module's event loop, printing into a buffer."""
    call = LocalCall(runtime, devices, out=io.StringIO())
    running = asyncio.create_task(call.run())
    await until(lambda: "listening" in printed(call), 30)
    yield call
    await call.hang_up()
    await asyncio.wait_for(running, 60)


def printed(call: LocalCall, start: int = 0) -> str:
    return call.line.out.getvalue()[start:]


async def until(condition: Callable[[], object], timeout: float = TURN_TIMEOUT_S,
                printed: Callable[[], str] = str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out; printed {printed()!r}"
        await asyncio.sleep(0.05)


async def say(wav: Path) -> None:
    """Play a WAV file into the microphone, in real time."""
    player = await asyncio.create_subprocess_exec("paplay", "-d", "mic", str(wav))
    assert await player.wait() == 0


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio)))) if len(audio) else 0.0


@needs_pulse
@pytest.mark.asyncio(loop_scope="module")
async def test_a_spoken_question_is_answered_aloud(call, runtime, recording, speech_wav, words):
    mark, start = len(printed(call)), recording.position()
    await say(speech_wav(QUESTION))
    pattern = re.compile(r"you: (.*)\nassistant: (.+)\n")
    await until(lambda: pattern.search(printed(call, mark)), printed=lambda: printed(call, mark))
    transcript, answer = pattern.search(printed(call, mark)).groups()
    assert {"capital", "france"} <= words(transcript)
    assert "[interrupted]" not in answer

    await until(lambda: len(call.line.playback) == 0)
    await asyncio.sleep(1.0)  # what the sound devices still buffer
    reply = recording.audio(start, recording.position())
    assert rms(reply) > 0.01, "the speaker stayed silent"
    heard = await runtime.engine.run_job(ASR_PARTIAL, reply)
    said = words(answer)
    assert len(words(heard) & said) >= max(2, len(said) // 3), (heard, answer)


@needs_pulse
@pytest.mark.asyncio(loop_scope="module")
async def test_speaking_over_the_reply_silences_it(call, devices, recording, speech_wav):
    playback = call.line.playback
    cleared: list[tuple[int, int]] = []  # (samples dropped, where the recording was then)
    clear = playback.clear

    def clear_and_note() -> int:
        dropped = clear()
        cleared.append((dropped, recording.position()))
        return dropped

    playback.clear = clear_and_note
    mark = len(printed(call))
    await say(speech_wav(STORY))
    await until(lambda: len(playback) > 2 * devices.output_rate)  # seconds of the reply queued to play...
    playing = recording.position()
    await until(lambda: recording.position() > playing + RATE // 2)  # ...and half a second of it played
    await say(speech_wav("Stop. Tell me something else."))
    await until(lambda: cleared)
    dropped, at = cleared[0]
    assert dropped > 0, "no queued reply was dropped"
    await until(lambda: "[interrupted]" in printed(call, mark))

    await until(lambda: recording.position() > at + 2 * RATE)
    assert rms(recording.audio(at - int(0.6 * RATE), at - int(0.1 * RATE))) > 0.01, "the reply was not playing"
    # Well before the next reply can start (the caller is still speaking), the speaker is silent.
    assert rms(recording.audio(at + int(0.7 * RATE), at + 2 * RATE)) < 0.001, "the reply played on"


def test_the_playback_buffer_wraps_drops_and_clears():
    buffer, out = PlaybackBuffer(5), np.empty(3, np.int16)
    buffer.write(np.arange(1, 4, dtype=np.int16))
    assert buffer.read_into(out) == 3 and out.tolist() == [1, 2, 3]
    buffer.write(np.arange(4, 11, dtype=np.int16))  # wraps around the end; 9 and 10 do not fit
    assert len(buffer) == 5 and buffer.dropped == 2
    more = np.empty(7, np.int16)
    assert buffer.read_into(more) == 5 and more.tolist() == [4, 5, 6, 7, 8, 0, 0]  # then silence
    buffer.write(np.ones(4, np.int16))
    assert buffer.clear() == 4 and len(buffer) == 0
    assert buffer.read_into(out) == 0 and out.tolist() == [0, 0, 0]


def test_no_sound_device_is_a_clear_error(tmp_path):
    """With no sound card and no sound server to reach, PortAudio lists no device at all."""
    if Path("/dev/snd").exists():
        pytest.skip("this machine has a sound card")
    env = {**os.environ, "PULSE_SERVER": f"unix:{tmp_path / 'no-server'}"}
    result = subprocess.run([sys.executable, "-m", "voicepipe", "talk"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("voicepipe: error: no audio input/output device found ("), result.stderr
    assert result.stderr.count("\n") == 1 and not result.stdout


async def test_talks_echo_reference_is_what_the_speaker_played_shifted_by_its_output_latency():
    """The speaker's callback, as PortAudio calls it (its time info stands in for a sound card's)."""
    from types import SimpleNamespace

    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.local.talk import LocalLine
    from voicepipe.pipeline import CallConfig

    front = AudioFrontEnd(CallConfig(), own_far_end=True)
    line = LocalLine(Devices(None, None, 16000, 16000), 16000, io.StringIO(), front)
    tone = (np.sin(np.arange(1600) / 5) * 8000).astype(np.int16)
    line.playback.write(tone)
    out = np.zeros((1600, 1), np.int16)
    before = time.monotonic()
    line.speaker(out, 1600, SimpleNamespace(outputBufferDacTime=5.25, currentTime=5.0), None)
    await asyncio.sleep(0)  # the far end is handed to the call's loop
    after = time.monotonic()
    start = front.far._chunks[0][0]
    assert before + 0.25 <= start <= after + 0.25  # played 250 ms from now, at the DAC
    assert np.allclose(front.far.read(start, 1600), tone / 32768.0, atol=1e-4)


class Callbacks:
    """The speaker's callbacks as PortAudio makes them, on a clock of the test's own."""

    def __init__(self, line, monkeypatch: pytest.MonkeyPatch, rate: int, frames: int) -> None:
        from types import SimpleNamespace

        import voicepipe.local.talk as talk

        self.line, self.rate, self.frames, self.now = line, rate, frames, 1000.0
        self.time = SimpleNamespace(outputBufferDacTime=0.03, currentTime=0.0)  # 30 ms to the DAC
        monkeypatch.setattr(talk, "monotonic", lambda: self.now)

    def run(self, n: int, late: float = 0.0) -> None:
        """`n` callbacks on time, the first of them `late` seconds late."""
        out = np.zeros((self.frames, 1), np.int16)
        for i in range(n):
            self.now += late if i == 0 else 0.0
            self.line.speaker(out, self.frames, self.time, None)
            self.now += self.frames / self.rate - (late if i == 0 else 0.0)


async def test_talks_echo_reference_is_the_speakers_stream_resampled_whole(monkeypatch):
    """Played at 44.1 kHz in 383-sample callbacks, the far end at 16 kHz is the sound resampled as one stream:
    each piece resampled on its own left an edge at every piece."""
    import soxr

    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.local.talk import LocalLine
    from voicepipe.pipeline import CallConfig

    front = AudioFrontEnd(CallConfig(), own_far_end=True)
    line = LocalLine(Devices(None, None, 16000, 44100), 44100, io.StringIO(), front)
    sound = (np.sin(np.arange(44100) * 2 * np.pi * 440 / 44100) * 8000).astype(np.int16)
    line.playback.write(sound)
    callbacks = Callbacks(line, monkeypatch, 44100, 383)
    callbacks.run(44100 // 383 + 20)
    await asyncio.sleep(0)  # the pieces are handed to the call's loop
    start = front.far._chunks[0][0]
    assert start == pytest.approx(1000.0 + 0.03)  # the stream's first sample, 30 ms to the DAC
    whole = soxr.resample(sound.astype(np.float32) / 32768.0, 44100, 16000)
    heard = front.far.read(start, len(whole))
    inner = slice(200, len(whole) - 400)  # the resamplers' own ends aside
    assert np.max(np.abs(heard[inner] - whole[inner])) < 0.003


async def test_a_late_callback_does_not_move_talks_echo_reference(monkeypatch):
    """A reply after a silence, its first callback 40 ms late (the process busy): the reference stays on the
    speaker stream's clock, so the echo stays where the canceller learnt it."""
    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.local.talk import LocalLine
    from voicepipe.pipeline import CallConfig

    front = AudioFrontEnd(CallConfig(), own_far_end=True)
    line = LocalLine(Devices(None, None, 16000, 16000), 16000, io.StringIO(), front)
    callbacks = Callbacks(line, monkeypatch, 16000, 320)
    callbacks.run(50)  # a second of silence: nothing is handed over
    assert not front.far._chunks
    line.playback.write(np.full(3200, 1000, np.int16))
    callbacks.run(10, late=0.04)
    await asyncio.sleep(0)
    assert front.far._chunks[0][0] == pytest.approx(1000.0 + 50 * 0.02 + 0.03)  # sample 16000's time, not 40 ms on


async def test_talks_echo_reference_keeps_every_reply_on_the_speaker_streams_own_sample_grid(monkeypatch):
    """Three replies of noise at 44.1 kHz, silences of odd lengths between them: each reply's far end at
    16 kHz is the speaker's whole stream resampled, to a small fraction of a sample. A resampler started
    again for each reply put each on a grid of its own (white noise came out 4-5 dB off, not 30)."""
    import soxr

    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.local.talk import LocalLine
    from voicepipe.pipeline import CallConfig

    front = AudioFrontEnd(CallConfig(), own_far_end=True)
    line = LocalLine(Devices(None, None, 16000, 44100), 44100, io.StringIO(), front)
    callbacks = Callbacks(line, monkeypatch, 44100, 383)
    played = []
    speaker = line.speaker
    line.speaker = lambda out, *rest: (speaker(out, *rest), played.append(out[:, 0].copy()))
    rng = np.random.default_rng(0)
    for silence in (150, 97, 131):
        callbacks.run(silence)
        line.playback.write((rng.standard_normal(44100) * 3000).astype(np.int16))
        callbacks.run(44100 // 383 + 1)
        await asyncio.sleep(0)
    callbacks.run(40)
    await asyncio.sleep(0)
    whole = soxr.resample(np.concatenate(played).astype(np.float32) / 32768.0, 44100, 16000)
    heard = front.far.read(1000.0 + 0.03, len(whole))
    errors = []
    for at in range(0, len(whole) - 800, 800):
        truth = whole[at:at + 800]
        if np.std(truth) > 0.01:  # 50 ms well inside a reply
            errors.append(10 * np.log10(np.sum((heard[at:at + 800] - truth) ** 2) / np.sum(truth ** 2)))
    assert len(errors) > 50 and max(errors) < -25
