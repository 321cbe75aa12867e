"""The `voicepipe` command: a whole spoken turn, its single-stage commands, and its errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from voicepipe.audio import read_audio
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.cli import build_parser, main
from voicepipe.pipeline.instructions import DEFAULT_INSTRUCTIONS, build_messages

SAMPLE = Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav"


def voicepipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voicepipe", *args], capture_output=True, text=True,
                          timeout=600)


def test_turn_speaks_the_answer_it_prints(tmp_path, speech_wav, asr, words):
    out = tmp_path / "reply.wav"
    done = voicepipe("turn", str(speech_wav("What is the capital of France?")), "-o", str(out), "--json",
                     "--max-tokens", "48")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"capital", "france"} <= words(result["transcript"])
    assert "paris" in words(result["answer"])
    assert result["output"] == str(out)
    timings = result["timings"]
    assert set(timings) == {"asr_s", "llm_first_token_s", "llm_total_s", "tts_first_audio_s", "total_s"}
    assert all(value > 0 for value in timings.values())
    assert timings["llm_first_token_s"] <= timings["llm_total_s"]
    assert timings["tts_first_audio_s"] <= timings["total_s"]
    reply = read_audio(out, asr.sample_rate)
    assert np.sqrt(np.mean(reply**2)) > 0.01  # not silence
    heard = words(asr.transcribe(reply))
    spoken = words(result["answer"])
    assert len(heard & spoken) >= len(spoken) / 2, (heard, spoken)


def test_transcribe_prints_the_transcript(capsys, words):
    assert main(["transcribe", str(SAMPLE)]) == 0
    assert {"capital", "france"} <= words(capsys.readouterr().out)


def test_say_writes_speech(tmp_path, asr, words):
    out = tmp_path / "said.wav"
    assert main(["say", "Good morning. The meeting starts soon.", "-o", str(out)]) == 0
    heard = words(asr.transcribe(read_audio(out, asr.sample_rate)))
    assert {"good", "morning", "meeting", "starts", "soon"} <= heard


@pytest.mark.slow
def test_chat_prints_the_answer_alone(capsys):
    assert main(["chat", "What is the capital of France?", "--max-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out and out.endswith("\n") and out.count("\n") == 1


def test_empty_system_prompt_sends_the_bare_chat_template(llm):
    _, tokenizer = llm
    args = build_parser().parse_args(["chat", "Hello there", "--system", ""])
    messages = build_messages(args.text, args.system)
    assert messages == [{"role": "user", "content": "Hello there"}]
    bare = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat_prompt_ids(tokenizer, messages) == tokenizer(bare, add_special_tokens=False)["input_ids"]
    default = build_parser().parse_args(["chat", "Hello there"])
    assert build_messages(default.text, default.system)[0] == {"role": "system", "content": DEFAULT_INSTRUCTIONS}


BAD_INPUTS = {
    "missing file": ["transcribe", "{dir}/missing.wav"],
    "empty file": ["transcribe", "{dir}/empty.wav"],
    "text file": ["transcribe", "{dir}/notes.wav"],
    "turn on a text file": ["turn", "{dir}/notes.wav", "-o", "{dir}/out.wav"],
    "missing ASR model": ["transcribe", "{sample}", "--asr-model", "{dir}/no-model"],
    "missing TTS voice": ["say", "hi", "-o", "{dir}/out.wav", "--tts-voice", "{dir}/no-voice.onnx"],
    "missing LLM": ["chat", "hi", "--llm-model", "{dir}/no-model.gguf"],
    "LLM that is not a GGUF": ["chat", "hi", "--llm-model", "{dir}/notes.wav"],
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "notes.wav").write_text("these are notes, not audio\n")
    assert main([arg.format(dir=tmp_path, sample=SAMPLE) for arg in BAD_INPUTS[case]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("voicepipe: error: ") and err.count("\n") == 1, err


def test_the_command_line_starts_without_loading_torch_or_the_mcp_sdk():
    """Every command parses its options, and fails on a bad one, before anything heavy loads (a listing of
    the bench's rooms once pulled torch in, and every command took seconds to say a file was missing)."""
    probe = ("import sys; from voicepipe.cli import build_parser; build_parser(); "
             "print(','.join(m for m in ('torch', 'transformers', 'mcp', 'faster_whisper') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_bad_input_exits_2_without_traceback_from_the_command(tmp_path):
    done = voicepipe("transcribe", str(tmp_path / "missing.wav"))
    assert done.returncode == 2
    assert done.stderr.startswith("voicepipe: error: ") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("system", ["", "Answer in one short sentence."])
def test_chat_on_the_engine_in_fp32_gives_the_same_answer_as_transformers_generate(system):
    question = ("chat", "Name a large animal that lives in the sea.", "--temperature", "0", "--max-tokens", "24",
                "--system", system, "--llm-precision", "fp32")
    engine, hf = voicepipe(*question, "--backend", "engine"), voicepipe(*question, "--backend", "hf")
    assert engine.returncode == 0 and hf.returncode == 0, engine.stderr + hf.stderr
    assert engine.stdout.strip() and engine.stdout == hf.stdout
