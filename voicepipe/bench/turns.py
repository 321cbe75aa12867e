"""`voicepipe bench turns`: the turn-taking evaluation over the generated set (`turn_set`).

Two parts:
- decisions: each complete and each cut sample, followed by the 200 ms pause at which a decision is
  taken, judged by the LLM (Whisper's transcript, then the end-of-message probability, as a call does) and
  by Smart Turn (the audio). Reported per detector: the false cut-offs (cut samples judged finished) at
  the threshold that catches 90% of the finished ones, and the time a decision takes;
- calls: every complete and paused sample spoken in real time to a real server, one call at a time, per
  turn detection mode. Reported: how long after the last speech sample the turn ended (speech_stopped)
  and the first reply audio came, and for paused sentences whether they were answered as one turn with
  the whole sentence heard, and whether any reply audio came before the caller had finished;
- speech over a reply: words (how soon after their onset the reply's audio stopped, and whether it was
  cancelled) and backchannels (whether the reply went on to its end).
"""

import asyncio
import logging
import time

import numpy as np

from voicepipe.audio import resample
from voicepipe.backends.loading import ASR_FINAL, ModelOptions
from voicepipe.bench.calls import bench_runtime
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.scripted_caller import AUDIO, ScriptedCaller
from voicepipe.bench.smart_turn import load_smart_turn
from voicepipe.bench.turn_set import ESPEAK_VOICES, RATE, Sample, espeak_audio, say_with, turn_set
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.pipeline import CallConfig, Conversation
from voicepipe.pipeline.end_of_turn import end_probability, unpunctuated
from voicepipe.protocol import ServerEvent
from voicepipe.server import VoiceServer

log = logging.getLogger(__name__)
CAUGHT = 0.9  # the share of finished sentences a detector must catch; its false cut-offs are read there
PAUSE_S = 0.2  # the silence after which a decision is taken (the endpointer's first pause)
MODES = ("server_vad", "semantic_vad")


# -- decisions ---------------------------------------------------------------------------------------------
async def llm_verdict(runtime: Runtime, text: str) -> float | None:
    """What a call's LLM stage would conclude at the pause from the transcript: its end probability."""
    conversation = Conversation(CallConfig().instructions, runtime.tokenizer)
    prompt = conversation.prompt_ids(2048, ({"role": "user", "content": text.strip()},))
    return await end_probability(runtime.engine, runtime.tokenizer, prompt, time.monotonic())


def false_cutoffs(complete: list[float], cut: list[float], caught: float = CAUGHT) -> dict:
    """At the highest threshold that still catches `caught` of the finished sentences, the share of cut
    ones judged finished too."""
    threshold = float(np.quantile(complete, 1 - caught, method="lower"))
    return {"threshold": threshold, "caught": float(np.mean([p >= threshold for p in complete])),
            "false_cutoffs": float(np.mean([p >= threshold for p in cut]))}


def waits(eagerness, complete: list[float], cut: list[float], cut_pauses: list[float]) -> dict:
    """What an eagerness makes of the LLM's verdicts: the silence each finished sentence waits before its
    turn ends, and the share of cut ones whose wait is shorter than the pause after them (cut off)."""
    pause_ms = int(PAUSE_S * 1000)
    complete_ms = [eagerness.silence_ms(p, pause_ms) for p in complete]
    cut_ms = [eagerness.silence_ms(p, pause_ms) for p in cut]
    return {"end_probability": eagerness.end_probability, "ended_at_the_pause": float(np.mean(
                [ms <= pause_ms for ms in complete_ms])),
            "complete_wait_p50_ms": percentile(complete_ms, 50), "complete_wait_p95_ms": percentile(complete_ms, 95),
            "false_cutoffs": float(np.mean([ms < 1000 * pause for ms, pause in zip(cut_ms, cut_pauses, strict=True)]))}


async def decisions(runtime: Runtime, samples: list[Sample]) -> dict:
    from voicepipe.pipeline.detection import EAGERNESS

    pause = np.zeros(int(PAUSE_S * RATE), np.float32)
    smart_turn = load_smart_turn()
    detectors = ("llm", "llm_as_heard", "smart_turn")
    scores: dict[str, dict[str, list[float]]] = {d: {"complete": [], "cut": []} for d in detectors}
    seconds: dict[str, list[float]] = {d: [] for d in (*detectors, "asr")}
    transcripts = []
    for sample in (s for s in samples if s.kind in ("complete", "cut")):
        audio = np.concatenate([sample.audio, pause])
        t0 = time.perf_counter()
        text = await runtime.engine.run_job(ASR_FINAL, resample(audio, RATE, runtime.asr_rate))
        seconds["asr"].append(time.perf_counter() - t0)
        heard = {}
        for detector, said in (("llm", unpunctuated(text)), ("llm_as_heard", text)):
            t0 = time.perf_counter()
            heard[detector] = await llm_verdict(runtime, said) or 0.0
            seconds[detector].append(time.perf_counter() - t0)
            scores[detector][sample.kind].append(heard[detector])
        transcripts.append({"voice": sample.voice, "kind": sample.kind, "said": sample.text, "heard": text,
                            **heard})
        if smart_turn is not None:
            t0 = time.perf_counter()
            scores["smart_turn"][sample.kind].append(smart_turn(audio))
            seconds["smart_turn"].append(time.perf_counter() - t0)
    report: dict = {"caught_target": CAUGHT, "transcripts": transcripts,
                    "asr_ms_p50": 1000 * percentile(seconds["asr"], 50)}
    for detector, by_kind in scores.items():
        if not by_kind["complete"]:
            report[detector] = None  # Smart Turn's weights are not installed
            continue
        report[detector] = {**false_cutoffs(by_kind["complete"], by_kind["cut"]),
                            "decision_ms_p50": 1000 * percentile(seconds[detector], 50),
                            "samples": {kind: len(v) for kind, v in by_kind.items()}}
    cut_pauses = [s.pause_s for s in samples if s.kind == "cut"]
    report["llm"]["eagerness"] = {name: waits(e, scores["llm"]["complete"], scores["llm"]["cut"], cut_pauses)
                                  for name, e in EAGERNESS.items()}
    return report


# -- calls -------------------------------------------------------------------------------------------------
async def speak(url: str, sample: Sample, mode: str, limit_s: float = 12.0) -> dict:
    """One call: set the mode, speak the sample in real time, then silence until its replies are done."""
    caller = await ScriptedCaller.call(url, {"type": mode})
    try:
        caller.say(np.zeros(int(0.3 * RATE), np.float32))
        _, speech_end = caller.say(sample.audio)

        def settled() -> bool:
            created = len(caller.of(ServerEvent.RESPONSE_CREATED))
            done = len(caller.of(ServerEvent.RESPONSE_DONE))
            return bool(created) and done == created and time.monotonic() > speech_end + 2.5

        await caller.until(settled, limit_s)
    finally:
        await caller.close()
    stopped, first_audio = caller.first(ServerEvent.SPEECH_STOPPED, speech_end - 0.05), caller.first(AUDIO)
    return {"kind": sample.kind, "voice": sample.voice, "said": sample.text,
            "turn_end_s": stopped - speech_end if stopped else None,
            "ttfa_s": first_audio - speech_end if first_audio else None,
            "transcripts": [e["transcript"] for e in caller.of(ServerEvent.TRANSCRIPT_COMPLETED)],
            "responses": len(caller.of(ServerEvent.RESPONSE_CREATED)),
            "audio_before_end": first_audio is not None and first_audio < speech_end}


async def speak_over(url: str, question: np.ndarray, over: np.ndarray, mode: str) -> dict:
    """Ask `question`, then say `over` half a second into the reply's audio: how soon that audio stopped
    (from the first loud sample of `over`), and how the reply ended."""
    caller = await ScriptedCaller.call(url, {"type": mode})
    try:
        caller.say(np.zeros(int(0.3 * RATE), np.float32))
        caller.say(question)
        await caller.until(lambda: caller.first(AUDIO) is not None, 30)
        await asyncio.sleep(0.5)
        onset, _ = caller.say(over)
        onset += int(np.flatnonzero(np.abs(over) > 0.01)[0]) / RATE
        await caller.until(lambda: bool(caller.of(ServerEvent.RESPONSE_DONE)), 60)
    finally:
        await caller.close()
    cleared = caller.first(ServerEvent.PLAYBACK_CLEARED, onset)
    done = caller.of(ServerEvent.RESPONSE_DONE)
    return {"stopped_after_s": cleared - onset if cleared else None,
            "status": done[0]["response"]["status"] if done else None}


async def interruptions(url: str, tts, mode: str, rounds: int = 6) -> dict:
    """Real interruptions (words) and backchannels ("mm-hm", "yeah") over replies, `rounds` of each."""
    question = say_with(tts, "Tell me about the city of Paris.")
    words = [say_with(tts, "Wait, tell me about Rome instead."), espeak_audio("en-us", "Stop, what about Spain?")]
    backchannels = [espeak_audio("en-us", "Mm-hmm."), say_with(tts, "Yeah.")]
    real = [await speak_over(url, question, words[n % 2], mode) for n in range(rounds)]
    back = [await speak_over(url, question, backchannels[n % 2], mode) for n in range(rounds)]
    stops = [r["stopped_after_s"] for r in real if r["stopped_after_s"] is not None]
    return {"real": {"rounds": rounds, "cancelled": sum(r["status"] == "cancelled" for r in real),
                     "audio_stopped_p50_s": percentile(stops, 50), "audio_stopped_max_s": max(stops, default=None)},
            "backchannel": {"rounds": rounds, "completed": sum(r["status"] == "completed" for r in back)},
            "results": {"real": real, "backchannel": back}}


def heard_whole(result: dict, sample: Sample) -> bool:
    """One user item, one reply, and the transcript holds words of both halves of the sentence."""
    if len(result["transcripts"]) != 1 or result["responses"] != 1:
        return False
    heard = set(_words(result["transcripts"][0]))
    return bool(heard & set(_words(sample.first))) and bool(heard & set(_words(sample.rest)))


def _words(text: str) -> list[str]:
    return [w.strip(".,?!'\"").lower() for w in text.split() if len(w.strip(".,?!'\"")) > 2]


async def calls(runtime: Runtime, tts, samples: list[Sample], modes: tuple[str, ...]) -> dict:
    server = VoiceServer(runtime, Limits(max_calls=1))
    await server.start("127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.port}/ws"
    report: dict = {}
    try:
        for mode in modes:
            results = []
            for sample in (s for s in samples if s.kind in ("complete", "paused")):
                result = await speak(url, sample, mode)
                result["one_turn"] = heard_whole(result, sample)
                results.append(result)
                log.info("%s %s: %s", mode, sample.kind, result)
                await asyncio.sleep(0.3)
            complete = [r for r in results if r["kind"] == "complete"]
            paused = [r for r in results if r["kind"] == "paused"]
            ends = [r["turn_end_s"] for r in complete if r["turn_end_s"] is not None]
            ttfas = [r["ttfa_s"] for r in complete if r["ttfa_s"] is not None]
            report[mode] = {
                "complete": {"turns": len(complete), "turn_end_p50_s": percentile(ends, 50),
                             "turn_end_p95_s": percentile(ends, 95), "ttfa_p50_s": percentile(ttfas, 50),
                             "ttfa_p95_s": percentile(ttfas, 95),
                             "answered": sum(r["ttfa_s"] is not None for r in complete)},
                "paused": {"turns": len(paused), "one_turn_rate": float(np.mean([r["one_turn"] for r in paused])),
                           "reply_audio_before_the_end": sum(r["audio_before_end"] for r in paused)},
                "results": results,
            }
        report["interruptions"] = await interruptions(url, tts, "semantic_vad")
    finally:
        await server.close()
    return report


async def bench_turns(options: ModelOptions | None = None, questions: int | None = 6,
                      voices: tuple[str, ...] = (*ESPEAK_VOICES, "piper"), modes: tuple[str, ...] = MODES,
                      decisions_only: bool = False) -> dict:
    from voicepipe.backends.tts_piper import PiperTTS

    options = options or ModelOptions()
    tts = PiperTTS(options.tts_model if options.tts == "piper" else None)
    samples = turn_set(tts, voices, questions)
    runtime = await bench_runtime(options, "process")
    try:
        report = {"samples": len(samples), "decisions": await decisions(runtime, samples)}
        if not decisions_only:
            report["calls"] = await calls(runtime, tts, samples, modes)
    finally:
        await runtime.close()
    return report


def print_turns(report: dict) -> None:
    d = report["decisions"]
    print(f"end-of-turn decisions at a {PAUSE_S * 1000:.0f} ms pause, {report['samples']} samples "
          f"(false cut-offs at the threshold catching {d['caught_target']:.0%} of finished sentences):")
    print(f"  (the LLM's decisions wait for the transcript at the pause: {d['asr_ms_p50']:.0f} ms p50)")
    for detector in ("llm", "llm_as_heard", "smart_turn"):
        r = d[detector]
        if r is None:
            print(f"  {detector}: not installed")
            continue
        print(f"  {detector}: false cut-offs {r['false_cutoffs']:.0%} (threshold {r['threshold']:.3f}, caught "
              f"{r['caught']:.0%}), {r['decision_ms_p50']:.0f} ms a decision (p50)")
    for name, r in d["llm"]["eagerness"].items():
        print(f"  eagerness {name}: {r['ended_at_the_pause']:.0%} of finished sentences end at the pause; their "
              f"silence p50 {r['complete_wait_p50_ms']:.0f} ms, p95 {r['complete_wait_p95_ms']:.0f} ms; "
              f"cut sentences cut off before their pause ends: {r['false_cutoffs']:.0%}")
    calls = dict(report.get("calls", {}))
    spoken_over = calls.pop("interruptions", None)
    for mode, r in calls.items():
        c, p = r["complete"], r["paused"]
        print(f"{mode}: complete questions ({c['turns']}, answered {c['answered']}): turn end p50 "
              f"{c['turn_end_p50_s']:.2f} s p95 {c['turn_end_p95_s']:.2f} s after the last speech sample, first "
              f"audio p50 {c['ttfa_p50_s']:.2f} s p95 {c['ttfa_p95_s']:.2f} s; paused sentences ({p['turns']}): "
              f"{p['one_turn_rate']:.0%} one turn with the whole sentence, {p['reply_audio_before_the_end']} with "
              f"reply audio before the caller finished")
    if spoken_over:
        real, back = spoken_over["real"], spoken_over["backchannel"]
        print(f"speech over a reply (semantic_vad): words cancelled {real['cancelled']} of {real['rounds']}, its audio "
              f"stopped {real['audio_stopped_p50_s']:.2f} s (p50) after their onset, at most "
              f"{real['audio_stopped_max_s']:.2f} s; backchannels let {back['completed']} of {back['rounds']} "
              "replies finish")
