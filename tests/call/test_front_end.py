"""The audio front end in a scripted room: the reply's audio, as the caller's loudspeaker played it, comes
back into the microphone through a synthetic room (a stand-in for a real speaker and microphone, which
cannot exist here), in real time, through the call's real pipeline (the Silero VAD, the front end, WebRTC's
AEC3) over the fake engine, whose TTS speaks a real voice recording."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.fake_call import Call

from voicepipe.audio import read_audio
from voicepipe.bench.room import Room, active_rms, at_snr, noise, overlay
from voicepipe.bench.speakerphone import SELF_NOISE, Loudspeaker
from voicepipe.frontend.expander import Expander
from voicepipe.frontend.processing import AudioProcessing
from voicepipe.frontend.reference import FarEnd, NearEnd
from voicepipe.frontend.stage import FrontEndStage
from voicepipe.pipeline.events import AudioIn, SpeechStarted, SpeechStopped

RATE = 16000
VOICE = read_audio(Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav", RATE)
FRAME = RATE // 50  # the caller's microphone sends 20 ms at a time


class VoiceTTS:
    """Speaks every sentence with a real voice: the sample question, backwards (still a voice to a VAD,
    and unlike the caller's own words)."""

    sample_rate = RATE

    @staticmethod
    def audio() -> np.ndarray:
        return VOICE[::-1] * np.float32(0.5)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        yield (self.audio() * 32767).astype(np.int16)


class Caller:
    """A speakerphone on the call (voicepipe.bench.speakerphone), with the caller's own `speech` (if any)
    from `speech_at` seconds, sending 20 ms at a time in real time."""

    def __init__(self, call: Call, room: Room, speech: np.ndarray | None = None, speech_at: float = 0.0) -> None:
        self.call, self.speech, self.speech_at = call, speech, speech_at
        self.speaker = Loudspeaker(room, 0.1, active_rms(VoiceTTS.audio()))
        self.seen = 0  # client messages read so far
        self.late_s = 0.0  # how far behind its clock a frame was sent, at worst

    def _receive(self, at: int) -> None:
        for message in self.call.client.messages[self.seen:]:
            if isinstance(message, bytes):
                self.speaker.receive(np.frombuffer(message, "<i2"), RATE, at)
            elif message.get("type") == "output_audio_buffer.cleared":
                self.speaker.clear(at)
        self.seen = len(self.call.client.messages)

    async def talk(self, seconds: float) -> None:
        t0, sent = time.monotonic(), 0
        while sent < seconds * RATE:
            await asyncio.sleep(max(0.0, t0 + (sent + FRAME) / RATE - time.monotonic()))
            self.late_s = max(self.late_s, time.monotonic() - t0 - (sent + FRAME) / RATE)
            end = sent + FRAME
            self._receive(end)
            mic = self.speaker.echo(end, FRAME)
            if self.speech is not None:
                at = int(self.speech_at * RATE)
                part = self.speech[max(0, sent - at): max(0, end - at)]
                mic[FRAME - len(part):] += part
            self.call.pipeline.push(AudioIn(mic))
            sent = end


def speech_started_after(call: Call, kind: str) -> int:
    kinds = call.client.kinds()
    return kinds[kinds.index(kind):].count("input_audio_buffer.speech_started") if kind in kinds else -1


async def ask(call: Call) -> None:
    """The question, as the VAD would have it (so the reply starts at once)."""
    now = time.monotonic()
    await call.push(SpeechStarted("item_q", 0, now),
                    SpeechStopped("item_q", 1000, now, RATE))


# The calls in a room run 5.5 s in real time, and the canceller's alignment needs the caller's frames on
# time: a loop held up by a busy neighbour sends them in bursts. They run in the slow lane, alone, and a run
# whose frames went out late says nothing of the canceller: it is run again (three times at most).
LATE_S = 0.06


async def in_room(reply: str, speech: np.ndarray | None = None, speech_at: float = 0.0, echo: bool = True
                  ) -> tuple[Call, Caller]:
    """A call 5.5 s long in a room with the reply's echo at the caller's level; the caller to close."""
    for _ in range(3):
        call = Call(reply=reply, tts=VoiceTTS(), echo_cancellation=echo)
        caller = Caller(call, Room(delay_ms=60, rt60_s=0.3, echo_db=0.0, seed=1), speech, speech_at)
        try:
            await ask(call)
            await caller.talk(5.5)
        except BaseException:
            await call.close()
            raise
        if caller.late_s < LATE_S:
            break
        await call.close()
    return call, caller
@pytest.mark.slow
@pytest.mark.parametrize("echo", [True, False])
async def test_the_replys_echo_at_the_callers_level_is_no_speech_with_the_canceller_on(echo):
    call, caller = await in_room("Paris is the capital of France. It is a big city.", echo=echo)
    try:
        started = speech_started_after(call, "response.audio.delta")
        if echo:
            assert started == 0, (caller.late_s, call.client.kinds())
            assert call.client.kinds().count("response.created") == 1  # no turn taken from its own voice
        else:
            assert started >= 1  # without the canceller the assistant hears itself
    finally:
        await call.close()


@pytest.mark.slow
async def test_a_real_interruption_over_the_echo_still_cancels_the_reply():
    call, _ = await in_room("Paris is the capital of France. It is a big city. It has many museums.",
                            VOICE * 0.1 / active_rms(VOICE), speech_at=2.5)
    try:
        assert speech_started_after(call, "response.audio.delta") >= 1
        assert "output_audio_buffer.cleared" in call.client.kinds() or any(
            m.get("response", {}).get("status") == "cancelled" for m in call.client.of("response.done"))
    finally:
        await call.close()


def test_the_far_end_is_read_back_where_it_played_and_cut_where_the_caller_dropped_it():
    far = FarEnd()
    tone = np.ones(1600, np.float32)
    far.play(10.0, tone, 10.0)
    assert far.read(9.95, 1600)[:800].sum() == 0 and far.read(9.95, 1600)[800:].sum() == 800
    far.cut(10.05)
    assert far.read(10.0, 1600).sum() == 800


def test_a_sentence_sent_in_frames_far_ahead_of_its_play_keeps_what_plays_now():
    """A long sentence goes out in 2 s frames at once, queued up to 20 s ahead: the far end still holds the
    audio playing now (forgotten by the latest frame's time, the echo of a reply went uncancelled mid-reply
    and barged in)."""
    far = FarEnd()
    far.play(10.0, np.ones(16000 * 2, np.float32), 10.0)
    for i in range(10):
        far.play(12.0 + 2 * i, np.full(16000 * 2, 0.5, np.float32), 10.9)
    assert far.read(11.0, 320).sum() == 320
    assert far.read(31.0, 320).sum() == 160
    far.play(40.0, np.ones(320, np.float32), 40.0)  # and forgotten once it is long past
    assert far.read(11.0, 320).sum() == 0


def test_the_far_end_says_where_it_started_anew_after_a_gap():
    far = FarEnd()
    tone = np.ones(320, np.float32)
    far.play(10.0, tone, 10.0)
    far.play(10.02, tone, 10.02)  # straight after: the same stream
    far.play(10.1, tone, 10.1)  # after 60 ms of nothing: the client's queue ran dry
    assert far.started(9.99, 320) == 160
    assert far.started(10.02, 320) is None
    assert far.started(10.08, 640) == 320
    for i in range(1, 600):  # a reply longer than the far end is kept: its start forgotten, nothing new
        far.play(10.1 + 0.02 * i, tone, 10.1 + 0.02 * i)
    assert far.started(21.0, 320) is None
    far.play(30.0, tone, 30.0)  # its audio came after the microphone's piece it starts in was read
    assert far.started(30.04, 320) == 0  # told at the next piece, not never
    assert far.started(30.06, 320) is None  # and once


def test_a_replys_chunks_played_back_to_back_are_one_stream_in_the_far_end():
    """Chunks at the voice's rate, each due as the last ends, read back as the whole reply resampled at once
    (as the caller's loudspeaker plays it), wherever their times fall between samples; each placed by its own
    rounded time and resampled on its own, they stood up to half a sample off it."""
    import soxr

    rng = np.random.default_rng(3)
    voice = (rng.standard_normal(22050 * 3) * 0.1).astype(np.float32)
    cuts = [0, 4111, 9000, 17377, 30001, 41234, 52000, len(voice)]
    far, start = FarEnd(), 10.00003
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        far.play(start + lo / 22050, voice[lo:hi], 10.0, 22050)
    whole = soxr.resample(voice, 22050, 16000)
    assert np.max(np.abs(far.read(start, len(whole)) - whole)) < 1e-4  # its last sentence's end included
    assert far.started(start - 0.01, 16000 * 4) == 160  # one start: the reply's own


def test_the_speakerphones_loudspeaker_plays_what_arrives_back_to_back_as_one_stream():
    import soxr

    from voicepipe.bench.room import Room
    from voicepipe.bench.speakerphone import Loudspeaker

    rng = np.random.default_rng(5)
    voice = (rng.standard_normal(22050 * 2) * 3000).astype(np.int16)
    speaker = Loudspeaker(Room(delay_ms=40, rt60_s=0.3, echo_db=0.0), 0.05, 0.05)
    for lo, hi in [(0, 9001), (9001, 20000), (20000, len(voice))]:
        speaker.receive(voice[lo:hi], 22050, 800)  # all queued at once, from sample 800
    whole = soxr.resample(voice.astype(np.float32) / 32768.0, 22050, 16000)
    assert np.max(np.abs(speaker.played[800:] - whole)) < 1e-4


def test_the_near_end_clock_holds_its_grid_through_late_arrivals():
    """Chunks held back 0-3 ms by the call's own work, in a sawtooth: their samples' times stay on one grid
    (following the late ones moved the echo under the linear canceller by a few samples at a time)."""
    near = NearEnd()
    times = [near.feed(320, 100.0 + 0.02 * (i + 1) + 0.003 * (i % 37) / 36) - 0.02 * i for i in range(500)]
    assert max(times[60:]) - min(times[60:]) < 1e-6


def test_the_near_end_clock_takes_the_fastest_arrival_and_reanchors_after_a_gap():
    near = NearEnd()
    assert near.feed(320, 100.02) == pytest.approx(100.0)
    assert near.feed(320, 100.05) == pytest.approx(100.02)  # 10 ms late: still recorded at 100.02
    assert near.feed(320, 100.06) == pytest.approx(100.04, abs=1e-3)
    assert near.feed(320, 110.0) == pytest.approx(110.0 - 0.02)  # a muted client came back


def test_a_sound_cards_word_on_when_it_recorded_is_taken_over_arrivals():
    near = NearEnd()
    near.recorded_by(0, 320, 100.02)  # the card's callback had the first 20 ms by 100.02
    assert near.feed(320, 100.30) == pytest.approx(100.0)  # it reached the call late, the process busy
    near.recorded_by(320, 320, 100.06)  # a callback itself late: the earliest word stands
    assert near.feed(320, 100.31) == pytest.approx(100.02, abs=1e-3)


def test_a_sound_cards_clock_holds_through_its_callbacks_wander_and_follows_a_break():
    """Callbacks 0-3 ms late in a sawtooth (as a sound server's came under load): sample times stay on one
    grid, to the microsecond. Samples lost (the callbacks 30 ms later from then on for 2 s): it follows."""
    from voicepipe.frontend.reference import StreamClock

    clock = StreamClock(16000)
    times = []
    for i in range(600):  # 12 s of 20 ms callbacks
        late = 0.003 * (i % 37) / 36 + (0.03 if i >= 400 else 0.0)
        clock.seen(320 * (i + 1), 100.0 + 0.02 * (i + 1) + late)
        times.append(clock.time(0))
    assert max(times[60:399]) - min(times[60:399]) < 1e-6  # no wander once settled
    assert times[599] == pytest.approx(100.03, abs=1e-3)  # the break, followed
    clock.restart()
    clock.seen(320, 200.02)
    assert clock.time(0) == pytest.approx(200.0)  # a break the card reported: placed afresh


def test_noise_reduction_off_leaves_the_audio_alone_and_near_field_quietens_steady_noise():
    hiss = at_snr(noise("pink", 3.0, seed=5), 0.1, 0.0)
    off = AudioProcessing(echo=False, noise=None)
    assert off.process(hiss, np.zeros_like(hiss)) is hiss
    near = AudioProcessing(echo=False, noise="near_field")
    out = near.process(hiss, np.zeros_like(hiss))
    assert active_rms(out[RATE:]) < 0.5 * active_rms(hiss[RATE:])


def test_the_suppressor_leaves_a_quiet_rooms_audio_as_it_came_and_steps_in_when_the_room_grows_noisy():
    """A suppressor bends a clean voice too (word error 0.20 -> 0.24 in a quiet room), so it is heard only
    over a noise floor above -45 dBFS."""
    rng = np.random.default_rng(3)
    quiet = rng.standard_normal(3 * RATE).astype(np.float32) * np.float32(10 ** (-70 / 20))
    quiet[RATE // 2:RATE // 2 + len(VOICE)] += VOICE[:len(quiet) - RATE // 2]  # the caller, in a quiet room
    loud = at_snr(noise("pink", 6.0, seed=5), 0.05, 10.0)  # a noise floor near -40 dBFS, judged over 5 s
    near = AudioProcessing(echo=False, noise="near_field")
    chunks = [near.process(x[i:i + 320], np.zeros(320, np.float32)) for x in (quiet, loud)
              for i in range(0, len(x), 320)]
    out = np.concatenate(chunks)
    assert np.array_equal(out[:len(quiet)], quiet)  # nothing to take away, and nothing taken
    assert np.std(out[-RATE:]) < 0.5 * np.std(loud[-RATE:])  # a noisy room: suppressed


def test_the_expander_takes_down_what_stands_well_under_the_callers_voice_and_leaves_the_voice():
    """Bursts of a voice at -26 dBFS with noise 20 dB under them between: after the first second, the bursts
    go through as they came and the noise between them is taken down by what it stands under the voice less
    10 dB (here 10 dB); noise 30 dB under, by 20."""
    rng = np.random.default_rng(4)
    expander = Expander()
    for under, cut in ((20.0, 10.0), (30.0, 20.0)):
        bursts = np.concatenate([np.full(30, -26.0), np.full(30, -26.0 - under)] * 10)  # 0.3 s each, in frames
        frames = [rng.standard_normal(160).astype(np.float32) * np.float32(10 ** (db / 20)) for db in bursts]
        gains = [20 * np.log10(np.std(expander.process(f)) / np.std(f)) for f in frames]
        later = np.arange(len(bursts)) >= 100
        voice = later & (bursts == -26.0)
        gap = later & (bursts < -26.0) & (np.arange(len(bursts)) % 60 >= 33)  # past the hold
        assert np.all(np.abs(np.array(gains)[voice]) < 0.01)
        assert np.mean(np.array(gains)[gap]) == pytest.approx(-cut, abs=1.0)  # frames' own levels wander a dB
        assert np.all(np.abs(np.array(gains)[gap] + cut) < 2.5)


async def test_a_session_update_turns_the_suppressor_on_and_off_in_what_the_asr_hears_and_the_vad_judges_the_rest():
    """Under near_field the audio going on is suppressed and carries the same audio before the suppressor, for
    the VAD to judge; under null it is the microphone's as it came, with nothing beside it."""
    from support.fake_call import run_stage

    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.pipeline import CallConfig
    from voicepipe.pipeline.requests import SessionUpdate

    hiss = at_snr(noise("pink", 2.0, seed=5), 0.1, 0.0)
    chunks = [AudioIn(hiss[i:i + 320]) for i in range(0, len(hiss), 320)]
    front = AudioFrontEnd(CallConfig(echo_cancellation=False))
    off = SessionUpdate("", True, {}, (), "auto", {"noise_reduction": None})
    down, _ = await run_stage(FrontEndStage(front), [*chunks, off, *chunks])
    audio = [e for e in down if isinstance(e, AudioIn)]
    suppressed, plain = audio[:len(chunks)], audio[len(chunks):]
    before = np.concatenate([e.unsuppressed for e in suppressed])
    after = np.concatenate([e.samples for e in suppressed])
    assert np.array_equal(before, hiss[:len(before)])  # the default suppressor; the VAD's audio is the microphone's
    assert active_rms(after[RATE:]) < 0.5 * active_rms(before[RATE:])  # what the ASR hears: the noise taken down
    assert all(e.unsuppressed is None for e in plain)
    assert np.array_equal(np.concatenate([e.samples for e in plain]), hiss)


def test_the_echo_figure_is_the_cancellers_alone_in_a_noisy_room():
    """Echo return loss enhancement compares the microphone with the audio before the suppressor: the noise
    the suppressor takes away in a noisy room is no echo the canceller removed."""
    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.pipeline import CallConfig

    reply = np.tile(VOICE, 3) * np.float32(0.3 / active_rms(VOICE))
    mic = Room(delay_ms=40, rt60_s=0.2, echo_db=0.0, seed=1).echo(reply, 0.05)
    mic = mic + at_snr(noise("pink", len(reply) / RATE + 1, seed=5), 0.05, 10.0)[:len(mic)]
    figures, now = {}, [100.0]
    for noise_reduction in (None, "near_field"):
        now[0] = 100.0
        front = AudioFrontEnd(CallConfig(noise_reduction=noise_reduction), clock=lambda: now[0])
        front.played(reply, RATE, 100.0)
        for i in range(0, len(mic), FRAME):
            now[0] = 100.0 + (i + FRAME) / RATE  # each chunk as it arrives, in real time
            front.clean(mic[i:i + FRAME])
        figures[noise_reduction] = front.echo.erle_db()
    assert front.processing.noisy
    assert figures["near_field"] == pytest.approx(figures[None], abs=1.0)


def test_audio_sent_faster_than_real_time_is_no_live_microphone():
    near = NearEnd()
    near.feed(320, 100.0)
    assert near.live
    near.feed(16000, 100.01)  # a second of audio in 10 ms
    assert not near.live
    near.feed(320, 101.0)
    assert near.live


def test_a_voice_is_said_into_the_blocks_it_falls_in_and_nowhere_else():
    voice = np.arange(1, 30, dtype=np.float32)
    blocks = [np.zeros(10, np.float32) for _ in range(5)]
    for i, block in enumerate(blocks):
        overlay(block, 100 + 10 * i, voice, 105)
    assert np.array_equal(np.concatenate(blocks), np.concatenate([np.zeros(5), voice, np.zeros(16)]))


def test_the_speakerphone_echoes_what_it_played_after_the_rooms_delay_and_stops_when_cleared():
    speaker = Loudspeaker(Room(delay_ms=100, rt60_s=0.2, echo_db=0.0, seed=2), 0.1, 0.1)
    click = np.zeros(3200, np.int16)
    click[0] = 16000
    speaker.receive(click, RATE, at=1600)
    echo = speaker.echo(8000, 8000)
    assert np.argmax(np.abs(echo)) == 1600 + 1600  # played at 0.1 s, heard 100 ms later
    speaker.receive(click, RATE, at=2000)  # queued behind the first
    assert speaker.queue_end == 1600 + 6400
    speaker.clear(2400)
    assert not speaker.playing(2400) and np.abs(speaker.echo(12000, 4000)).max() < 10 * SELF_NOISE  # its hiss


def test_a_phone_line_carries_the_voice_band_as_g711_a_chunk_at_a_time():
    from voicepipe.bench.phone_line import PhoneLine, down_the_line

    t = np.arange(RATE) / RATE
    low, high = (np.float32(0.1) * np.sin(2 * np.pi * f * t).astype(np.float32) for f in (1000, 6000))

    def level(x: np.ndarray) -> float:  # dB, past the filter's start
        return 10 * np.log10(np.mean(np.square(x[1000:], dtype=np.float64)) + 1e-12)

    assert abs(level(down_the_line(low, RATE)) - level(low)) < 1.0  # the voice's band passes
    assert level(down_the_line(high, RATE)) < level(high) - 30  # above it, gone
    line = PhoneLine(RATE)
    chunked = np.concatenate([line.process(low[i:i + 320]) for i in range(0, RATE, 320)])
    assert np.array_equal(chunked, down_the_line(low, RATE))  # the filter carries on across chunks
    assert len(np.unique(chunked)) <= 256  # an 8-bit code a sample


def test_over_a_phone_line_the_far_end_stays_as_sent_and_the_echo_never_barges_in():
    """The speakerphone plays what the line delivered; the server's far end is the reply as it sent it, so
    the canceller meets an echo through the line twice, and still keeps it from barging in."""
    from voicepipe.bench.barge_in_echo import try_room

    room = Room(delay_ms=100, rt60_s=0.2, echo_db=0.0, seed=2)
    reply = (VOICE * 16000).astype(np.int16)
    plain, phone = Loudspeaker(room, 0.1, 0.1), Loudspeaker(room, 0.1, 0.1, phone=True)
    for speaker in (plain, phone):
        speaker.receive(reply, RATE, at=0)
    assert np.array_equal(phone.played, plain.played)
    echoes = plain.echo(len(VOICE), len(VOICE)), phone.echo(len(VOICE), len(VOICE))
    assert np.abs(echoes[0] - echoes[1]).max() > 0.01 * np.abs(echoes[0]).max()  # heard through the line

    sentences = [VOICE[::-1][i:i + RATE] for i in range(0, len(VOICE) - RATE // 2, RATE // 2)]
    reply_rms = active_rms(np.concatenate(sentences))
    on = try_room(room, None, True, sentences, [VOICE], 0.05, reply_rms, n_replies=6, phone=True)
    assert on["interruptions"] == 3 and on["missed"] == 0 and on["false_barge_ins_per_100_replies"] == 0
    off = try_room(room, None, False, sentences, [VOICE], 0.05, reply_rms, n_replies=6, phone=True)
    assert off["false_barge_ins_per_100_replies"] > 0


def test_with_no_echo_path_a_caller_over_the_reply_is_kept_whole():
    """Headphones, or a client with its own canceller: the loudspeaker is never heard, and the canceller,
    which starts out assuming an echo, must not eat the caller's words."""
    rng = np.random.default_rng(0)
    reply = np.tile(VOICE, 4) * np.float32(0.3 / active_rms(VOICE))
    far = np.concatenate([np.zeros(2 * RATE, np.float32), reply])
    near = (rng.standard_normal(len(far)) * 0.001).astype(np.float32)
    caller = VOICE[::-1] * np.float32(0.1 / active_rms(VOICE))
    at = 5 * RATE
    near[at:at + len(caller)] += caller
    processing = AudioProcessing(echo=True, noise=None)
    out = np.concatenate([processing.process(near[i:i + 160], far[i:i + 160]) for i in range(0, len(near), 160)])
    assert not processing.path.present
    kept = active_rms(out[at:at + len(caller)]) / active_rms(near[at:at + len(caller)])
    assert kept > 0.7  # within 3 dB


def test_a_verdict_of_no_echo_outlives_a_long_silence_and_a_short_reply_talked_over():
    """Once the loudspeaker proved not to be heard, a caller who then waits a while and talks over the
    start of the next reply (too little far end to judge on) is not gated away as a speakerphone's echo."""
    rng = np.random.default_rng(1)
    reply = np.tile(VOICE, 2) * np.float32(0.3 / active_rms(VOICE))
    caller = VOICE[::-1] * np.float32(0.1 / active_rms(VOICE))
    gap = np.zeros(15 * RATE, np.float32)
    far = np.concatenate([reply, gap, reply[: len(caller)]])
    near = (rng.standard_normal(len(far)) * 0.001).astype(np.float32)
    at = len(reply) + len(gap)
    near[at:] += caller
    processing = AudioProcessing(echo=True, noise=None)
    out = np.concatenate([processing.process(near[i:i + 160], far[i:i + 160]) for i in range(0, len(near), 160)])
    assert processing.path.verdict is False
    halves = range(at, len(near) - RATE // 2, RATE // 2)
    assert min(active_rms(out[i:i + RATE // 2]) / active_rms(near[i:i + RATE // 2]) for i in halves) > 0.7


def test_a_microphone_that_sent_digital_silence_is_not_taken_for_a_speakerphone_over_the_first_reply():
    """A client that gates its own input (zeros between words, as the soak's callers send) asks, then talks
    from the first reply's first syllable: no far end yet to judge the echo path on, but a raw microphone in a
    room never sends zeros, so the caller is not cancelled away as the loudspeaker's echo."""
    reply = np.tile(VOICE, 2) * np.float32(0.3 / active_rms(VOICE))
    caller = VOICE[::-1] * np.float32(0.1 / active_rms(VOICE))
    at = RATE  # a second of zeros before the reply and the caller both begin
    far = np.concatenate([np.zeros(at, np.float32), reply])
    near = np.zeros(len(far), np.float32)
    near[at:at + len(caller)] = caller
    processing = AudioProcessing(echo=True, noise=None)
    out = np.concatenate([processing.process(near[i:i + 160], far[i:i + 160]) for i in range(0, len(near), 160)])
    assert processing.path.verdict is False
    halves = range(at, at + len(caller) - RATE // 2, RATE // 2)
    assert min(active_rms(out[i:i + RATE // 2]) / active_rms(near[i:i + RATE // 2]) for i in halves) > 0.7


async def test_the_stage_tells_the_turns_when_the_microphone_proves_not_to_hear_the_loudspeaker():
    """The verdict goes down the pipeline (the own-voice net is off where no echo can come back), once."""
    from itertools import count

    from support.fake_call import run_stage

    from voicepipe.frontend.stage import AudioFrontEnd
    from voicepipe.pipeline import CallConfig
    from voicepipe.pipeline.events import EchoPathJudged, Playout

    ticks = count(1)
    front = AudioFrontEnd(CallConfig(), clock=lambda: next(ticks) * 0.01)  # 10 ms arrive every 10 ms
    hiss = np.random.default_rng(0).standard_normal(RATE // 100).astype(np.float32) * 0.001
    reply = (np.tile(VoiceTTS.audio(), 2) * 32767).astype(np.int16)
    events = [AudioIn(hiss)] * 100 + [Playout(reply, RATE, 1.01)] + [AudioIn(hiss)] * 300
    down, _ = await run_stage(FrontEndStage(front), events)
    assert [e for e in down if isinstance(e, EchoPathJudged)] == [EchoPathJudged(False)]


def test_over_a_speakerphones_echo_interruptions_are_heard_and_the_echo_never_barges_in():
    """`bench room`'s many-tries stream, short: replies through a room, the caller speaking over every
    other one. Without the canceller every reply barges in on itself."""
    from voicepipe.bench.barge_in_echo import try_room

    sentences = [VOICE[::-1][i:i + RATE] for i in range(0, len(VOICE) - RATE // 2, RATE // 2)]
    reply_rms = active_rms(np.concatenate(sentences))
    room = Room(delay_ms=120, rt60_s=0.45, echo_db=0.0, seed=1)
    on = try_room(room, None, True, sentences, [VOICE], 0.05, reply_rms, n_replies=6)
    assert on["interruptions"] == 3 and on["missed"] == 0 and on["false_barge_ins_per_100_replies"] == 0
    off = try_room(room, None, False, sentences, [VOICE], 0.05, reply_rms, n_replies=6)
    assert off["false_barge_ins_per_100_replies"] > 0
