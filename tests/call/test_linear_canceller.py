"""The linear canceller beside AEC3 (frontend/linear_stage.py): once it has learnt a room, a caller talking
over a loud echo reaches the VAD whole; until then, and when the room changes, AEC3's output is heard."""

import numpy as np
from support.echo_rooms import CALLER_RMS, VOICE, reply_audio

from voicepipe.bench.room import Room, active_rms
from voicepipe.bench.speakerphone import Loudspeaker
from voicepipe.frontend import linear_stage
from voicepipe.frontend.linear_stage import LinearStage
from voicepipe.frontend.processing import FRAME, RATE, AudioProcessing


def run(processing: AudioProcessing, room: Room, reply: np.ndarray, caller_at: int | None = None
        ) -> tuple[np.ndarray, np.ndarray, list[bool]]:
    """The reply through `room` into the microphone (with the caller's voice from `caller_at`), frame by
    frame through `processing`: the microphone, the output, and whether the linear output was trusted."""
    speaker = Loudspeaker(room, CALLER_RMS, active_rms(reply))
    speaker.receive((reply * 32767).astype(np.int16), RATE, 0)
    caller = VOICE * np.float32(CALLER_RMS / active_rms(VOICE))
    mics, outs, trusted = [], [], []
    for at in range(0, len(reply) // FRAME * FRAME, FRAME):
        mic = speaker.echo(at + FRAME, FRAME)
        if caller_at is not None and caller_at <= at < caller_at + len(caller):
            part = caller[at - caller_at: at - caller_at + FRAME]
            mic[:len(part)] += part
        outs.append(processing.process(mic, speaker.played[at:at + FRAME]))
        mics.append(mic)
        trusted.append(processing.linear.proven)
    return np.concatenate(mics), np.concatenate(outs), trusted


def callers_share(out: np.ndarray, at: int) -> float:
    """How much of the caller's voice is in `out` from `at`: its projection on the voice (1: all of it)."""
    voice = VOICE * np.float32(CALLER_RMS / active_rms(VOICE))
    heard = out[at:at + len(voice)]
    voice = voice[:len(heard)]
    return float(np.dot(heard, voice) / np.dot(voice, voice))


LOUD_ROOM = Room(delay_ms=120, rt60_s=0.45, echo_db=6.0, seed=1)


def test_once_it_has_learnt_the_room_a_caller_over_a_louder_echo_reaches_the_vad_whole():
    processing = AudioProcessing(echo=True, noise=None)
    reply = reply_audio(32.0)
    at = (len(reply) - 3 * RATE) // FRAME * FRAME
    mic, out, trusted = run(processing, LOUD_ROOM, reply, caller_at=at)
    assert not any(trusted[:300]) and trusted[-1]  # AEC3's output while it learns, its own after
    before = slice(at - 4 * RATE, at)  # the echo alone, once trusted
    assert active_rms(out[before]) < active_rms(mic[before]) * 10 ** (-20 / 20)  # at least 20 dB removed
    assert callers_share(out, at) > 0.6


def test_a_short_first_reply_replayed_in_the_silence_after_it_has_the_caller_heard_over_the_second():
    """A call's first reply, 2.5 s, teaches the filter too little to be trusted over the next one; heard
    again while the caller asks their next question, it does."""
    processing = AudioProcessing(echo=True, noise=None)
    long = reply_audio(6.0)
    first, second = long[: int(2.5 * RATE)], long[3 * RATE:]
    gap = np.zeros(2 * RATE, np.float32)
    reply = np.concatenate([first, gap, second])
    at = len(first) + len(gap) + RATE  # a second into the second reply
    mic, out, trusted = run(processing, LOUD_ROOM, reply, caller_at=at)
    starts = (len(first) + len(gap)) // FRAME
    assert not any(trusted[: len(first) // FRAME]) and all(trusted[starts + 60:])
    echo = slice(starts * FRAME, at)  # the second reply's echo, before the caller speaks
    assert active_rms(out[echo]) < active_rms(mic[echo]) * 10 ** (-20 / 20)
    assert callers_share(out, at) > 0.6


def test_the_filter_starts_where_a_far_rooms_echo_starts_and_learns_it():
    """250 ms of delay and a reverberant tail: the 300 ms filter covers it only from the echo's start."""
    processing = AudioProcessing(echo=True, noise=None)
    room = Room(delay_ms=250, rt60_s=0.5, echo_db=6.0, seed=3)
    mic, out, trusted = run(processing, room, reply_audio(30.0))
    assert 15 <= processing.linear.delay_frames <= 25  # the echo starts 25 frames late
    assert trusted[-1]
    late = slice(25 * RATE, 30 * RATE)
    assert active_rms(out[late]) < active_rms(mic[late]) * 10 ** (-20 / 20)


def test_a_frame_it_would_make_well_louder_is_left_as_it_came_and_a_caller_cancelling_the_echo_is_kept():
    """A filter that has learnt one room subtracts that room's echo from a microphone that hears none: left
    as it came. But a caller over the echo whose voice cancels part of it within a frame stands louder in the
    filter's output than in the microphone, and that output is theirs: kept."""
    stage = LinearStage(RATE, FRAME)
    reply = reply_audio(20.0)
    speaker = Loudspeaker(LOUD_ROOM, CALLER_RMS, active_rms(reply))
    speaker.receive((reply * 32767).astype(np.int16), RATE, 0)
    end = len(reply) // FRAME * FRAME
    for at in range(FRAME, end - 2 * RATE, FRAME):
        stage.process(speaker.echo(at, FRAME), speaker.played[at - FRAME:at], None)
    kept, at = [], end - 2 * RATE
    while len(kept) < 3:  # on through the reply to where its echo is loud, then three such frames
        echo = speaker.echo(at, FRAME)
        loud = kept or active_rms(echo) > CALLER_RMS
        voice = -0.55 * echo if loud else 0 * echo  # in the microphone 0.45 of the echo, alone 0.55: 1.7 dB louder
        out = stage.process(echo + voice, speaker.played[at - FRAME:at], None)
        if loud:
            kept.append(not stage.wrong and np.dot(out - voice, out - voice) < 0.25 * np.dot(voice, voice))
        at += FRAME
    assert all(kept)
    quiet = np.full(FRAME, 1e-4, np.float32)
    outs, wrong = [], []
    for i in range(0, 2 * RATE, FRAME):
        outs.append(stage.process(quiet, reply[i:i + FRAME], None))
        wrong.append(stage.wrong)
    assert max(float(np.dot(o, o)) for o in outs) <= linear_stage.WRONG * float(np.dot(quiet, quiet))
    assert sum(wrong) > 50


def test_when_the_room_changes_the_filter_is_doubted_and_trusted_again_once_it_has_learnt_the_new_one():
    processing = AudioProcessing(echo=True, noise=None)
    reply = reply_audio(30.0)
    run(processing, LOUD_ROOM, reply)
    assert processing.linear.proven
    mic, out, trusted = run(processing, Room(delay_ms=40, rt60_s=0.3, echo_db=0.0, seed=2), reply)
    doubted = trusted.index(False)
    assert doubted < 300  # within 3 s
    again = trusted.index(True, doubted)
    assert again > doubted + 500 and all(trusted[again:])
    late = slice(20 * RATE, len(out))
    assert active_rms(out[late]) < active_rms(mic[late]) * 10 ** (-20 / 20)


def test_when_the_echo_comes_a_few_milliseconds_later_the_filter_follows_it_and_stays_trusted():
    """A sound server's buffer grew by 3 ms in the silence between replies: the same room, its echo 48
    samples later. The filter's far end moves with the echo's lag, so what it learnt still holds; relearning
    took seconds."""
    processing = AudioProcessing(echo=True, noise=None)
    reply = reply_audio(30.0)
    run(processing, LOUD_ROOM, reply)
    assert processing.linear.proven
    later = Room(delay_ms=123, rt60_s=0.45, echo_db=6.0, seed=1)
    mic, out, trusted = run(processing, later, np.concatenate([np.zeros(RATE, np.float32), reply[:11 * RATE]]))
    assert np.mean(trusted) > 0.9
    late = slice(6 * RATE, 12 * RATE)
    assert active_rms(out[late]) < active_rms(mic[late]) * 10 ** (-20 / 20)


def next_reply(room: Room, told_late: int = 0, seconds: float = 6.0
               ) -> tuple[np.ndarray, np.ndarray, list[bool], list[str]]:
    """A filter trusted after 30 s of replies in LOUD_ROOM, then the next reply (audio it has not heard)
    through `room` for `seconds`, its far end told `told_late` samples late and starting anew at its first
    frame: the microphone, the output, and per frame whether the filter was trusted and whose output the
    call heard."""
    processing = AudioProcessing(echo=True, noise=None)
    run(processing, LOUD_ROOM, reply_audio(30.0))
    assert processing.linear.trusted
    reply = reply_audio(36.0)[30 * RATE:]
    speaker = Loudspeaker(room, CALLER_RMS, active_rms(reply))
    speaker.receive((reply * 32767).astype(np.int16), RATE, 0)
    told = np.concatenate([np.zeros(told_late, np.float32), speaker.played])  # the far end as the server places it
    mics, outs, trusted, shown = [], [], [], []
    for at in range(0, int(seconds * RATE) // FRAME * FRAME, FRAME):
        mics.append(speaker.echo(at + FRAME, FRAME))
        outs.append(processing.process(mics[-1], told[at:at + FRAME], 0 if at == 0 else None))
        trusted.append(processing.linear.trusted)
        shown.append(processing.canceller)
    assert processing.linear.proven
    return np.concatenate(mics), np.concatenate(outs), trusted, shown


def test_where_the_far_end_starts_anew_the_filter_is_heard_again_once_it_has_found_the_echo_moved_a_frame():
    """A client whose queue ran dry starts the next reply on its own next 20 ms frame: the echo comes 20 ms
    later than in the last reply. The filter, out of line by that, is not heard until the echo's lag is
    found in the new audio; then it follows it, and still knows the room."""
    mic, out, trusted, shown = next_reply(Room(delay_ms=140, rt60_s=0.45, echo_db=6.0, seed=1))
    assert not any(trusted[:30]) and all(trusted[100:])  # heard again within a second
    assert [s == "linear" for s in shown] == trusted  # the page says which canceller's output the call hears
    late = slice(4 * RATE, len(out))
    assert active_rms(out[late]) < active_rms(mic[late]) * 10 ** (-20 / 20)


def test_an_echo_one_sample_later_than_the_last_replys_moves_the_far_end_with_it():
    """Between replies the echo's lag moves by a single sample (a client's queue started anew). Left one
    sample out of line, the filter takes 10-15 dB off instead of 30, is doubted and learns the room again
    (on recorded calls, the echo barged in first); the far end follows it instead, and the filter stays
    heard."""
    mic, out, trusted, _ = next_reply(LOUD_ROOM, told_late=1)
    assert all(trusted[100:])
    late = slice(2 * RATE, len(out))
    assert active_rms(out[late]) < active_rms(mic[late]) * 10 ** (-20 / 20)


def test_where_the_far_end_starts_anew_the_filter_is_heard_again_as_soon_as_the_new_audio_places_the_echo():
    """A reply after a gap, its echo 8 samples off the last one's: estimates over the new audio alone find
    it within 0.3 s (the echo 120 ms late), where those over the usual half-second window waited for the old
    audio to leave it (0.49 s here). AEC3, heard meanwhile, lets a reply's first echo through (on recorded
    calls, the false barge-ins left came there)."""
    mic, out, trusted, _ = next_reply(LOUD_ROOM, told_late=8, seconds=1.0)
    first = trusted.index(True)
    assert first <= 30 and all(trusted[first:])
    heard = slice(first * FRAME, 40 * FRAME)  # and takes the echo out from there
    assert active_rms(out[heard]) < active_rms(mic[heard]) * 10 ** (-15 / 20)


def test_an_echo_between_two_samples_that_moves_by_one_moves_the_far_end_with_it():
    """An echo 0.55 samples past a whole one (two clocks), one sample later in the next reply: the far end
    moves from where it was aligned, not from the whole sample nearest (1920 here), which the move leaves
    only 0.55 away."""
    stage = LinearStage(RATE, FRAME)
    stage._since_start = linear_stage.FRESH  # the estimates' windows are of the far end's current audio
    for lag in (1919.55, 1919.55):  # two estimates agreeing align the filter
        stage._follow(lag)
    aligned = stage.delay_frames
    for lag in (1920.55, 1920.55):
        stage._follow(lag)
    assert round((stage.delay_frames - aligned) * FRAME) == 1
    for lag in (1920.9, 1920.2):  # an estimate's wander within a sample moves nothing
        stage._follow(lag)
    assert round((stage.delay_frames - aligned) * FRAME) == 1


def test_a_caller_who_talks_over_a_replys_start_has_the_filter_heard_again_once_the_echo_is_found():
    """Held frames the caller talks over keep their voice, so the filter takes little off most of them; it is
    heard again all the same, and much of the caller through it (AEC3 alone, heard until then, keeps none of
    the caller over this echo: measured, a share of -0.09)."""
    processing = AudioProcessing(echo=True, noise=None)
    run(processing, LOUD_ROOM, reply_audio(30.0))
    reply = reply_audio(36.0)[30 * RATE:]  # audio the filter has not heard
    speaker = Loudspeaker(LOUD_ROOM, CALLER_RMS, active_rms(reply))
    speaker.receive((reply * 32767).astype(np.int16), RATE, 0)
    caller = VOICE * np.float32(CALLER_RMS / active_rms(VOICE))
    at = RATE // 10  # 100 ms into the reply, for the whole of the sample
    outs, trusted = [], []
    for start in range(0, len(reply) // FRAME * FRAME, FRAME):
        mic = speaker.echo(start + FRAME, FRAME)
        if at <= start < at + len(caller):
            part = caller[start - at: start - at + FRAME]
            mic[:len(part)] += part
        outs.append(processing.process(mic, speaker.played[start:start + FRAME], 0 if start == 0 else None))
        trusted.append(processing.linear.trusted)
    assert not trusted[20] and trusted[70]  # held from the start, heard again within 0.7 s, the caller talking
    out = np.concatenate(outs)
    heard = slice(RATE // 2, at + len(caller))  # the caller's words once it is heard again
    voice = np.zeros(len(out), np.float32)
    voice[at:at + len(caller)] = caller[:len(out) - at]
    assert np.dot(out[heard], voice[heard]) / np.dot(voice[heard], voice[heard]) > 0.4


def test_without_libspeexdsp_aec3_cancels_alone(monkeypatch):
    monkeypatch.setattr(linear_stage, "library", lambda: None)
    processing = AudioProcessing(echo=True, noise=None)
    assert not processing.linear.available
    reply = reply_audio(10.0)
    mic, out, trusted = run(processing, LOUD_ROOM, reply)
    late = slice(5 * RATE, 10 * RATE)
    assert not any(trusted) and active_rms(out[late]) < active_rms(mic[late]) * 10 ** (-20 / 20)


def test_frames_silenced_as_echo_carry_the_rooms_own_noise():
    """Digital silence among the frames set the VAD's level floor to -100 dBFS, and any residue of the echo
    then counted as speech; the silenced frames carry the room's noise at its own level instead."""
    from voicepipe.bench.speakerphone import SELF_NOISE

    processing = AudioProcessing(echo=True, noise=None)
    mic, out, trusted = run(processing, LOUD_ROOM, reply_audio(12.0))
    frames = out[RATE:len(out) // FRAME * FRAME].reshape(-1, FRAME)
    energy = np.mean(np.square(frames, dtype=np.float64), axis=1)
    assert energy.min() > 0
    quiet = 10 * np.log10(np.percentile(energy, 5) / SELF_NOISE ** 2)
    assert -6 < quiet < 6  # within 6 dB of the microphone's own noise
