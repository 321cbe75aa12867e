"""`voicepipe bench threads`: the thread-pool policies of `voicepipe.backends.threads`, each in a fresh process.

The pattern is a call's: model steps, an ASR pass, more steps, a TTS sentence, more steps, all on one
thread as the engine runs them. Reported per policy (medians): a small torch op, a batch-1 decode step on
its own and right after an ASR or TTS job (when the other runtime's threads may still be spinning), and
the ASR and TTS jobs themselves.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from voicepipe.backends.threads import ENV_VAR, POLICIES, configure

QUESTION = "What is the capital of France, and how many people live there?"
SENTENCE = "Paris is the capital of France."
ROUNDS = 5


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure() -> dict:
    """Run the pattern in this process, under whatever policy it was started with."""
    import numpy as np
    import torch

    from scheduler import Engine, EngineConfig, SamplingParams, Sequence
    from voicepipe.audio import resample
    from voicepipe.backends.asr_whisper import WhisperASR
    from voicepipe.backends.base import chat_prompt_ids
    from voicepipe.backends.models import load_llm
    from voicepipe.backends.tts_piper import PiperTTS

    model, tokenizer = load_llm()
    asr, tts = WhisperASR(), PiperTTS()
    speech = np.concatenate(list(tts.synthesize(QUESTION))).astype(np.float32) / 32768
    clip = resample(speech, tts.sample_rate, asr.sample_rate)
    linear, x = torch.nn.Linear(576, 576), torch.randn(1, 576)
    with torch.inference_mode():
        for _ in range(50):
            linear(x)
        small_op = statistics.median(_timed(lambda: linear(x)) for _ in range(300))
    engine = Engine(model, tokenizer, EngineConfig())
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": QUESTION}])
    seq = engine.add_request(Sequence(prompt, SamplingParams(max_tokens=1000, ignore_eos=True)))
    while not seq.output_ids:
        engine.step()
    steady = [_timed(engine.step) for _ in range(10)]
    asr_s, tts_s, after_asr, after_tts = [], [], [], []
    for _ in range(ROUNDS):
        asr_s.append(_timed(lambda: asr.transcribe(clip)))
        after_asr.append(_timed(engine.step))
        steady += [_timed(engine.step) for _ in range(3)]
        tts_s.append(_timed(lambda: list(tts.synthesize(SENTENCE))))
        after_tts.append(_timed(engine.step))
        steady += [_timed(engine.step) for _ in range(3)]
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {"small_op_us": 1e6 * small_op, "decode_step_ms": ms(steady), "decode_after_asr_ms": ms(after_asr),
            "decode_after_tts_ms": ms(after_tts), "asr_pass_ms": ms(asr_s), "tts_sentence_ms": ms(tts_s),
            "torch_threads": torch.get_num_threads()}


def bench_threads(policies: list[str]) -> dict:
    """Each policy in a fresh interpreter, one after another; returns {policy: figures}."""
    results = {}
    for policy in policies:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        env[ENV_VAR] = policy
        run = subprocess.run([sys.executable, "-m", "voicepipe.bench.threads"], env=env, capture_output=True,
                             text=True, timeout=900)
        if run.returncode != 0:
            results[policy] = {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"}
        else:
            results[policy] = json.loads(run.stdout.strip().splitlines()[-1])
    return results


def print_threads(results: dict) -> None:
    columns = ("small_op_us", "decode_step_ms", "decode_after_asr_ms", "decode_after_tts_ms", "asr_pass_ms",
               "tts_sentence_ms")
    print(f"{'policy':12}" + "".join(f"{c:>21}" for c in columns))
    for policy, r in results.items():
        cells = "".join(f"{r[c]:21.1f}" for c in columns) if "error" not in r else f"  ({r['error']})"
        print(f"{policy:12}{cells}  {' '.join(f'{k}={v}' for k, v in POLICIES[policy].items()) or '(defaults)'}")


if __name__ == "__main__":
    configure()
    print(json.dumps(measure()))
