"""Echo cancellers from PyPI, measured side by side on the same synthetic rooms (docs/audio-front-end.md).

Run it in a scratch venv that holds the candidates (they are not the project's dependencies):

    python3 -m venv /tmp/aec && /tmp/aec/bin/pip install numpy soundfile soxr livekit pywebrtc-audio speexdsp-aec
    PYTHONPATH=. /tmp/aec/bin/python scripts/echo-candidates.py CALLER.wav REPLY.wav

CALLER.wav is a voice for the near end, REPLY.wav the assistant's (any rate; both are taken to 16 kHz). For
each room (echo level, delay, RT60) it prints, per candidate: the echo return loss enhancement over the last
half of the reply alone (ERLE, dB), how much of the caller's voice survives while both talk (dB of the
caller's energy kept, 0 is all of it) and its distortion there (the caller's voice over the rest of the
output, dB), and the CPU time per second of audio.
"""

import sys
import time

import numpy as np
import soundfile
import soxr

from voicepipe.bench.room import RATE, Room, active_rms

FRAME = RATE // 100  # 10 ms: the frame every WebRTC-derived canceller takes


def livekit_apm():
    from livekit import rtc

    apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        out = np.empty_like(near)
        for i in range(0, len(near) - FRAME + 1, FRAME):
            ref = rtc.AudioFrame((far[i:i + FRAME] * 32767).astype(np.int16).tobytes(), RATE, 1, FRAME)
            mic = rtc.AudioFrame((near[i:i + FRAME] * 32767).astype(np.int16).tobytes(), RATE, 1, FRAME)
            apm.process_reverse_stream(ref)
            apm.process_stream(mic)
            out[i:i + FRAME] = np.frombuffer(mic.data, np.int16) / 32768.0
        return out
    return run


def pywebrtc_aec3():
    import pywebrtc_audio

    aec = pywebrtc_audio.EchoCanceller(sample_rate=RATE)

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        out = np.empty_like(near)
        for i in range(0, len(near) - FRAME + 1, FRAME):
            out[i:i + FRAME] = aec.process(near[i:i + FRAME], far[i:i + FRAME])
        return out
    return run


def speex_mdf():
    import speexdsp_aec

    aec = speexdsp_aec.SpeexAec(sample_rate=RATE, frame_ms=10, filter_tail_ms=500)

    def run(near: np.ndarray, far: np.ndarray) -> np.ndarray:
        out = np.zeros_like(near)
        for i in range(0, len(near) - FRAME + 1, FRAME):
            pcm = [(x[i:i + FRAME] * 32767).astype(np.int16) for x in (near, far)]
            done = aec.process(*pcm)
            if done:
                out[i:i + FRAME] = np.frombuffer(done, np.int16)[:FRAME] / 32768.0
        return out
    return run


CANDIDATES = {"livekit (WebRTC APM, AEC3)": livekit_apm, "pywebrtc-audio (AEC3)": pywebrtc_aec3,
              "speexdsp-aec (Speex MDF)": speex_mdf}
ROOMS = [Room(120, 0.45, 6.0, 1), Room(40, 0.3, 0.0, 2), Room(250, 0.5, 6.0, 3), Room(200, 0.8, -6.0, 4)]


def energy(x: np.ndarray) -> float:
    return float(np.mean(np.square(x.astype(np.float64)))) + 1e-12


def main(caller_path: str, reply_path: str) -> None:
    def load(path: str) -> np.ndarray:
        audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
        return soxr.resample(audio.mean(axis=1), rate, RATE).astype(np.float32)

    caller, reply = load(caller_path), load(reply_path)
    caller *= 0.1 / active_rms(caller)
    reply *= 0.3 / active_rms(reply)
    # The reply alone for its first part, then the caller speaks over its last seconds (double talk).
    n = len(reply) + RATE
    talk_start = len(reply) - len(caller) // 2
    near = np.zeros(n, np.float32)
    near[talk_start:talk_start + len(caller)] = caller[: n - talk_start]
    far = np.zeros(n, np.float32)
    far[: len(reply)] = reply
    lone = slice(len(reply) // 4, talk_start)  # converged, reply alone
    both = slice(talk_start, len(reply))
    print(f"{'room':34} {'candidate':28} {'ERLE dB':>8} {'kept dB':>8} {'SDR dB':>7} {'CPU ms/s':>9}")
    for room in ROOMS:
        echo = room.echo(far, 0.1)
        mic = echo + near
        label = f"echo {room.echo_db:+g} dB, {room.delay_ms:g} ms, RT60 {room.rt60_s:g} s"
        for name, make in CANDIDATES.items():
            try:
                run = make()
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is reported, not fatal
                print(f"{label:34} {name:28} unavailable: {e}")
                continue
            t0 = time.process_time()
            out = run(mic, far)
            cpu = (time.process_time() - t0) / (n / RATE) * 1000
            erle = 10 * np.log10(energy(mic[lone]) / energy(out[lone]))
            kept = 10 * np.log10(energy(out[both]) / energy(near[both]))
            sdr = 10 * np.log10(energy(near[both]) / energy(out[both] - near[both]))
            print(f"{label:34} {name:28} {erle:8.1f} {kept:8.1f} {sdr:7.1f} {cpu:9.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
