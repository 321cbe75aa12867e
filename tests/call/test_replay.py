"""`bench replay` (voicepipe/bench/replay.py): a call recorded by its front end, run again through the front
end and the VAD, tells the caller's interruption from the echo as the call would have."""

import json

import numpy as np
from support.echo_rooms import CALLER_RMS, VOICE, reply_audio

from voicepipe.bench.replay import Utterance, judged, replay_folder
from voicepipe.bench.room import Room, active_rms
from voicepipe.bench.speakerphone import Loudspeaker
from voicepipe.frontend.processing import FRAME, RATE
from voicepipe.frontend.recording import FrontEndRecording

PIECE = 2 * FRAME
INTERRUPTION_AT = 16 * RATE
SPOKEN_AT = INTERRUPTION_AT + int(np.argmax(np.abs(VOICE) > 0.02 * np.abs(VOICE).max()))  # past its silence


def recorded_call(folder, name: str, echo: bool) -> None:
    """A speakerphone call, 20 s of reply with the caller talking over it from 16 s, recorded as its front
    end would have been given it, and the caller's script beside it."""
    reply = reply_audio(20.0)
    speaker = Loudspeaker(Room(delay_ms=120, rt60_s=0.45, echo_db=-10.0, seed=1), CALLER_RMS, active_rms(reply))
    speaker.receive((reply * 32767).astype(np.int16), RATE, 0)
    caller = VOICE * np.float32(CALLER_RMS / active_rms(VOICE))
    recording = FrontEndRecording()
    for at in range(0, len(reply) // PIECE * PIECE, PIECE):
        mic = speaker.echo(at + PIECE, PIECE)
        if INTERRUPTION_AT <= at < INTERRUPTION_AT + len(caller):
            part = caller[at - INTERRUPTION_AT:][:PIECE]
            mic[:len(part)] += part
        recording.add(mic, speaker.played[at:at + PIECE], 0 if at == 0 else None, echo, None)
    recording.save(folder / f"{name}.npz")
    script = {"room": "echo 10 dB under the caller", "onsets": [SPOKEN_AT],
              "spoken": [[SPOKEN_AT, INTERRUPTION_AT + len(caller), "What is the capital of Italy?"]]}
    (folder / f"{name}.json").write_text(json.dumps(script))


def test_a_replayed_call_tells_the_interruption_from_the_echo_and_the_canceller_from_none(tmp_path):
    recorded_call(tmp_path, "cancelled", echo=True)
    recorded_call(tmp_path, "raw", echo=False)  # the same call, its canceller off
    calls = {call["call"]: call for call in replay_folder(tmp_path)["calls"]}
    cancelled, raw = calls["cancelled"], calls["raw"]
    assert cancelled["interruption_stop_s"][0] <= 0.3
    assert len(raw["false_barge_ins"]) > len(cancelled["false_barge_ins"])  # the echo barges in on itself
    assert cancelled["room"] == "echo 10 dB under the caller"


def test_utterances_are_the_callers_the_echos_or_sounds_too_short_to_barge_in():
    utterances = [Utterance(16.1, 40, 16.2, True),  # the caller, over the reply
                  Utterance(5.0, 6, 5.2, True),  # the echo, barging in
                  Utterance(7.0, 2, None, True),  # the echo's residue, too short to
                  Utterance(30.0, 2, None, False)]  # a sound in the silence: no reply to barge in on
    script = {"spoken": [[16 * RATE, 18 * RATE, "What is the capital of Italy?"]], "onsets": [16 * RATE]}
    assert judged(utterances, script) == {"false_barge_ins": [5.2], "sounds": [(7.0, 2)],
                                          "interruption_stop_s": [0.2]}


def test_a_recording_keeps_the_settings_as_they_changed_and_the_audio_while_the_front_end_was_off(tmp_path):
    """A page that turns the server's canceller off and on again mid-call: the replay follows it, and the
    audio of the time between is there, so the caller's script still lines up."""
    from voicepipe.frontend.recording import load

    recording = FrontEndRecording()
    piece = np.full(PIECE, 0.01, np.float32)
    for n, (echo, noise) in enumerate([(True, "near_field")] * 3 + [(False, None)] * 2 + [(True, "near_field")]):
        recording.add(piece, np.zeros(PIECE, np.float32), 5 if n == 1 else None, echo, noise)
    recording.save(tmp_path / "call.npz")
    near, far, restarts, settings = load(tmp_path / "call.npz")
    assert len(near) == 6 * PIECE and restarts == [PIECE + 5]
    assert settings == [(0, True, "near_field"), (3 * PIECE, False, None), (5 * PIECE, True, "near_field")]
    assert not list(tmp_path.glob("*.part.npz"))
