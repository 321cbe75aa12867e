"""`voicepipe bench replay DIR`: calls recorded by their audio front end (`serve --record-front-end DIR`,
`bench room --record DIR`) run again through the front end and the VAD, in the 20 ms pieces the page and
the bench's callers send, the far end starting anew where it did and the front end's settings changing
where they did: each utterance the VAD began, how much of it was speech, and where it would have barged
in. Where `bench room` left the caller's script beside a recording (`<call id>.json`: when they spoke,
when they interrupted), each is told apart: the caller's, an interruption and how soon it stopped the
reply, or the echo's (a false barge-in, or a sound too short to barge in).

The VAD runs with server_vad's defaults whatever the call had: its starts and barge-ins are the same under
either detection, only its ends differ. Replays of the bench's calls raised the live calls' false
barge-ins at the same moments (docs/audio-front-end.md, "One sample out of line").
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from voicepipe.frontend.processing import AudioProcessing
from voicepipe.frontend.recording import RATE, Settings, load
from voicepipe.pipeline.detection import TurnDetection
from voicepipe.turns.endpointer import Endpointer
from voicepipe.turns.own_voice import TAIL_S
from voicepipe.turns.vad_stage import BARGE_IN_MS, WINDOW_MS

PIECE = RATE // 50  # 20 ms, as the page and the bench's callers send
TAIL = int(TAIL_S * RATE)  # begun this soon after the far end played, an utterance began over the reply


@dataclass
class Utterance:
    found_s: float  # when the VAD found it begun (the end of the piece it was found in)
    voiced_windows: int
    barge_in_s: float | None  # when its speech reached a barge-in's length
    over_reply: bool  # begun while the far end played, or within a second after


def replay(near: np.ndarray, far: np.ndarray, restarts: list[int], settings: list[Settings]) -> list[Utterance]:
    """A recorded call's utterances, as its front end and the VAD find them again."""
    changes = iter(settings)
    _, echo, noise = next(changes, (0, True, "near_field"))
    change = next(changes, None)
    processing, endpointer = AudioProcessing(echo, noise), Endpointer(TurnDetection("server_vad"))
    found: list[Utterance] = []
    current: Utterance | None = None
    played = -2 * TAIL  # the last sample the far end played
    starts = iter(sorted(restarts))
    restart = next(starts, None)
    for at in range(0, len(near), PIECE):
        while change is not None and change[0] <= at:
            processing.configure(change[1], change[2])
            change = next(changes, None)
        piece = far[at:at + PIECE]
        active = np.flatnonzero(piece)
        if len(active):
            played = at + int(active[-1])
        here = None
        while restart is not None and restart < at + PIECE:
            here = max(0, restart - at)
            restart = next(starts, None)
        out = processing.process(near[at:at + PIECE], piece, here)
        now = (at + PIECE) / RATE
        for boundary in endpointer.feed(out, processing.unsuppressed):
            if boundary.kind == "start":
                current = Utterance(now, 0, None, at + PIECE - played <= TAIL)
                found.append(current)
            elif boundary.kind == "audio" and boundary.is_speech and current is not None:
                current.voiced_windows += 1
                if current.voiced_windows * WINDOW_MS == BARGE_IN_MS:
                    current.barge_in_s = now
            elif boundary.kind == "stop":
                current = None
    return found


def spoken_at(spoken: list, at: float, after: int) -> bool:
    """Whether sample `at` falls in the caller's words (`spoken`: [start, end, text] in samples), from a
    quarter second before them to `after` samples past their end: how `bench room` and its replays tell
    the caller's speech from the echo's."""
    return any(start - RATE // 4 <= at <= end + after for start, end, _ in spoken)


def judged(utterances: list[Utterance], script: dict) -> dict:
    """The utterances told apart by the caller's script: `spoken` ([start, end, text] in samples of the
    recording) and `onsets` (where their interruptions began)."""
    echo = [u for u in utterances if u.over_reply and not spoken_at(script["spoken"], u.found_s * RATE, RATE // 2)]
    barge_ins = [u.barge_in_s for u in utterances if u.barge_in_s is not None]
    stopped = []
    for onset in script["onsets"]:
        after = [b - onset / RATE for b in barge_ins if 0 <= b - onset / RATE <= 2.0]
        stopped.append(round(after[0], 2) if after else None)
    return {"false_barge_ins": [u.barge_in_s for u in echo if u.barge_in_s is not None],
            "sounds": [(u.found_s, u.voiced_windows) for u in echo if u.barge_in_s is None],
            "interruption_stop_s": stopped}


def replay_folder(folder: Path) -> dict:
    """Every recording in `folder`, replayed; judged where its script lies beside it."""
    calls = []
    for path in sorted(p for p in folder.glob("*.npz") if not p.name.endswith(".part.npz")):
        near, far, restarts, settings = load(path)
        utterances = replay(near, far, restarts, settings)
        call = {"call": path.stem, "seconds": round(len(near) / RATE, 1),
                "utterances": [asdict(u) for u in utterances]}
        script_path = path.with_suffix(".json")
        if script_path.exists():
            script = json.loads(script_path.read_text())
            call.update(room=script.get("room"), live=script.get("figures"), **judged(utterances, script))
        calls.append(call)
    return {"calls": calls}


def print_replay(report: dict) -> None:
    false = sounds = caught = tries = 0
    for call in report["calls"]:
        print(f"{call['call']} ({call.get('room') or 'no script'}), {call['seconds']} s: "
              f"{len(call['utterances'])} utterances")
        if "false_barge_ins" not in call:
            for u in call["utterances"]:
                over = "  over the reply" if u["over_reply"] else ""
                barge_in = "" if u["barge_in_s"] is None else f"  barge-in at {u['barge_in_s']:.2f} s"
                print(f"  {u['found_s']:7.2f} s  {u['voiced_windows']:3d} windows of speech{over}{barge_in}")
            continue
        live = (call.get("live") or {}).get("false_barge_ins")
        print(f"  false barge-ins at {call['false_barge_ins']} s (the live call had {live}); sounds over a reply "
              f"(s, windows) {call['sounds']}; interruptions stopped after {call['interruption_stop_s']} s")
        false, sounds = false + len(call["false_barge_ins"]), sounds + len(call["sounds"])
        caught += sum(1 for s in call["interruption_stop_s"] if s is not None and s <= 0.3)
        tries += len(call["interruption_stop_s"])
    print(f"total: {false} false barge-ins, {sounds} sounds over a reply, {caught}/{tries} interruptions "
          "stopped within 300 ms")
