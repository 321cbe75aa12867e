"""The benchmark commands run end to end and report what they promise (their figures are not judged here)."""

import json
import math
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_bench_calls_reports_turns_of_a_real_call(tmp_path):
    out = tmp_path / "calls.json"
    run = subprocess.run([sys.executable, "-m", "voicepipe", "bench", "calls", "--calls", "1", "--turns", "1",
                          "--policies", "o4", "--deadline", "30", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    level = report["policies"]["o4"]["levels"][0]
    assert level["calls"] == 1 and level["turns"] == 1
    assert 0 < level["ttfa_p50_s"] < 30 and level["deadline_hit_rate"] == 1.0
    assert report["policies"]["o4"]["max_calls_within_deadline"] == 1
    assert "holds 1 calls" in run.stdout


def test_hf_static_counts_each_request_done_at_its_own_length(llm):
    from voicepipe.bench.engine_modes import run_hf_static
    from voicepipe.bench.workload import Workload

    model, tokenizer = llm
    items = Workload(requests=3, prompt_tokens=(20, 40), output_tokens=(2, 6)).items(tokenizer)
    result = run_hf_static(model, tokenizer, items, batch_size=2)
    assert result["tokens"] == sum(w.max_tokens for w in items)
    assert 0 < result["ttft_p50_s"] <= result["latency_p50_s"] <= result["latency_p99_s"] <= result["makespan_s"]


def test_calls_are_timed_from_the_last_speech_sample_not_the_trailing_silence():
    import numpy as np

    from voicepipe.bench.calls import last_voiced

    tone = 0.5 * np.sin(np.arange(8000) / 5.0).astype(np.float32)
    clip = np.concatenate([np.zeros(4800, np.float32), tone, np.zeros(4800, np.float32)])
    assert 4800 + 7990 <= last_voiced(clip) < 4800 + 8000


@pytest.mark.slow
def test_bench_mixed_reports_calls_beside_api_traffic(tmp_path):
    out = tmp_path / "mixed.json"
    run = subprocess.run([sys.executable, "-m", "voicepipe", "bench", "mixed", "--calls", "1", "--turns", "1",
                          "--streams", "2", "--prompt-tokens", "120", "--api-max-tokens", "8", "--alone", "4",
                          "--policies", "o4", "--deadline", "30", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["api_streams"] == 2 and report["calls"] == 1 and list(report["policies"]) == ["o4"]
    o4 = report["policies"]["o4"]
    assert o4["calls"]["turns"] == 1 and 0 < o4["calls"]["ttfa_p50_s"] < 30 and o4["calls"]["on_time_rate"] == 1.0
    for phase in ("api_alone", "api_mixed"):
        api = o4[phase]
        assert api["tokens_per_s"] > 0 and api["requests_sent"] > 0, phase
        assert 0 < api["ttft_p50_s"] <= api["ttft_p95_s"] < api["window_s"] + 30, phase
    assert math.isclose(o4["api_throughput_ratio"], o4["api_mixed"]["tokens_per_s"] / o4["api_alone"]["tokens_per_s"])
    assert "o4" in run.stdout and "API alone" in run.stdout


def test_mixed_bench_counts_api_tokens_when_they_stream_not_when_the_request_ends():
    from voicepipe.bench.mixed import ApiRequest

    finished = ApiRequest(0.0, [1.0, 2.0, 3.0, 4.0], tokens=8)  # one chunk held two tokens' text
    assert finished.tokens_between(0.0, 2.5) == 4 and finished.tokens_between(2.5, 9.0) == 4
    assert ApiRequest(0.0, [1.0, 2.0]).tokens_between(1.5, 9.0) == 1  # cut off: one token a chunk
    assert ApiRequest(0.0).tokens_between(0.0, 9.0) == 0


def test_bench_engine_rounds_alternate_the_modes_order_and_report_medians(monkeypatch):
    """Two rounds run o4, fcfs then fcfs, o4; each mode's figure is the median of its runs."""
    from voicepipe.bench import engine_modes, engine_setup
    from voicepipe.bench.engine_command import compare_modes
    from voicepipe.bench.workload import Workload

    order: list[str] = []
    speeds = iter([100.0, 140.0, 120.0, 110.0])

    def run_engine(model, tokenizer, items, config):
        order.append(config.policy)
        return {"throughput_tok_s": next(speeds), "steps": 7}

    monkeypatch.setattr(engine_modes, "run_engine", run_engine)
    monkeypatch.setattr(engine_setup, "items_for", lambda workload, tokenizer: [])
    monkeypatch.setattr(engine_setup, "release_device_memory", lambda: None)
    result = compare_modes(None, None, Workload(), ["o4", "fcfs"], {}, rounds=2)
    assert order == ["o4", "fcfs", "fcfs", "o4"]
    assert result["o4"] == {"throughput_tok_s": 105.0, "steps": 7, "rounds_throughput_tok_s": [100.0, 110.0]}
    assert result["fcfs"]["throughput_tok_s"] == 130.0


def test_bench_room_places_each_false_barge_in_and_sums_calls_per_100_replies():
    """A reply cleared while the caller was silent is a false barge-in: placed in its reply and that reply's
    audio, with the canceller the call's last stats showed; several calls' figures sum."""
    from voicepipe.bench.room import RATE
    from voicepipe.bench.room_bench import Heard, figures, merged

    stats = {"type": "scheduler.stats", "stats": {"audio_input": {"canceller": "linear",
                                                                 "echo_return_loss_enhancement_db": 31.0}}}
    heard = Heard(spoken=[(0, RATE, "What is the capital of Italy?")],
                  events=[(RATE + RATE // 2, {"type": "response.created"}),
                          (6 * RATE, stats), (10 * RATE, {"type": "response.created"}),
                          (11 * RATE, {"type": "output_audio_buffer.cleared"})],
                  first_audio=[2 * RATE, 10 * RATE + RATE // 2])
    call = figures(heard, [], front=True)
    assert call["false_barge_ins"] == 1
    assert call["false_barge_in_at"] == [{"at_s": 11.0, "reply": 2, "into_reply_audio_s": 0.5, "canceller": "linear",
                                          "echo_return_loss_enhancement_db": 31.0}]
    quiet = figures(Heard(spoken=heard.spoken, events=heard.events[:2], first_audio=[2 * RATE]), [], front=True)
    both = merged([call, quiet])
    assert (both["replies"], both["false_barge_ins"], both["false_barge_ins_per_100_replies"]) == (3, 1, 100 / 3)
    assert len(both["calls"]) == 2 and both["false_barge_in_at"] == call["false_barge_in_at"]


def test_bench_room_counts_a_question_whose_reply_began_before_its_last_word_as_cut():
    """A reply begun while the caller still spoke is a premature end of turn; one begun after is not, nor
    one begun during an interruption (which is meant to stop a reply, not to be answered whole)."""
    from voicepipe.bench.room import RATE
    from voicepipe.bench.room_bench import INTERRUPTION, Heard, figures

    spoken = [(RATE, 3 * RATE, "What is the capital of Italy?"), (6 * RATE, 8 * RATE, INTERRUPTION)]
    heard = Heard(spoken=spoken, events=[(3 * RATE + RATE // 2, {"type": "response.created"}),
                                         (7 * RATE, {"type": "response.created"})])
    assert figures(heard, [], front=True)["questions_cut"] == 0
    heard.events.append((2 * RATE, {"type": "response.created"}))
    assert figures(heard, [], front=True)["questions_cut"] == 1


def test_bench_room_interrupts_only_a_reply_still_playing_in_a_room_without_echo():
    """With headphones (no echo path) the caller still plays the reply: a reply of a phrase, over before a
    second of it has played, is not interrupted (an interruption of nothing would count as missed); a long
    one is, once it has played a second with half a second still to come."""
    import asyncio

    import numpy as np

    from voicepipe.bench.room import RATE
    from voicepipe.bench.room_bench import FRAME, SpeakerphoneCaller
    from voicepipe.bench.room_cases import CASES

    async def interrupted(reply_s: float) -> bool:
        caller = SpeakerphoneCaller(None, CASES[0], reply_rms=0.05, voices=[])
        assert CASES[0].room is None

        async def clock() -> None:  # the microphone's samples, in real time
            while True:
                await asyncio.sleep(FRAME / RATE)
                caller.sent += FRAME

        ticking = asyncio.create_task(clock())
        caller.speaker.receive(np.full(int(reply_s * RATE), 1000, np.int16), RATE, caller.sent)
        try:
            return await caller.into_audio(1.0, timeout_s=4.0)
        finally:
            ticking.cancel()

    assert not asyncio.run(interrupted(0.7))
    assert asyncio.run(interrupted(3.0))


def test_bench_room_counts_an_utterance_begun_after_the_callers_last_word_as_a_phantom():
    """The echo of a reply's start heard as "Thank you." half a second after the question: a phantom, though
    its transcript comes within the seconds a question's own transcript may take."""
    from voicepipe.bench.room import RATE
    from voicepipe.bench.room_bench import Heard, figures

    def utterance(item: str, start_ms: int, at: float, text: str) -> list[tuple[int, dict]]:
        return [(int(at * RATE) - RATE // 2, {"type": "input_audio_buffer.speech_started", "item_id": item,
                                              "audio_start_ms": start_ms}),
                (int(at * RATE), {"type": "conversation.item.input_audio_transcription.completed",
                                  "item_id": item, "transcript": text})]

    question = [(RATE, 2 * RATE, "What is the capital of Italy?")]
    heard = Heard(spoken=question, events=utterance("a", 700, 2.6, "What is the capital of Italy?"))
    assert figures(heard, [], front=True)["phantom_transcripts"] == 0
    heard.events += utterance("c", 2400, 3.4, "")  # an utterance of no words: no turn
    assert figures(heard, [], front=True)["phantom_transcripts"] == 0
    heard.events += utterance("b", 2440, 3.5, "Thank you.")
    call = figures(heard, [], front=True)
    assert call["phantom_transcripts"] == 1 and call["replies_to_own_voice"] == 0  # transcribed, not answered
    assert (call["phantom_at"][0]["transcript"], call["phantom_at"][0]["at_s"]) == ("Thank you.", 2.44)
    heard.events.append((int(3.9 * RATE), {"type": "response.created"}))  # a reply to it
    assert figures(heard, [], front=True)["replies_to_own_voice"] == 1
    # begun on the echo's tail, 0.8 s before the next question, and run on into it: the caller's words
    heard.spoken.append((5 * RATE, 6 * RATE, "How many days are in a week?"))
    heard.events += utterance("d", 4200, 6.8, "That's that. How many days are we on week?")
    assert figures(heard, [], front=True)["phantom_transcripts"] == 1
    heard.events += utterance("e", 4200, 6.9, "Goodbye.")
    assert figures(heard, [], front=True)["phantom_transcripts"] == 2


def test_bench_room_counts_the_utterances_the_server_dropped_and_any_that_held_the_callers_words():
    """An item the server dropped as its own voice is no phantom (the client never shows it); one begun while
    the caller spoke is their words lost."""
    from voicepipe.bench.room import RATE
    from voicepipe.bench.room_bench import Heard, figures

    def dropped(item: str, start_ms: int, at: float, text: str) -> list[tuple[int, dict]]:
        return [(int(at * RATE) - RATE // 2, {"type": "input_audio_buffer.speech_started", "item_id": item,
                                              "audio_start_ms": start_ms}),
                (int(at * RATE), {"type": "conversation.item.deleted", "item_id": item, "reason": "own_voice",
                                  "transcript": text})]

    heard = Heard(spoken=[(RATE, 2 * RATE, "What is the capital of Italy?")], events=dropped("a", 4000, 4.6, "Rome"))
    call = figures(heard, [], front=True)
    assert (call["dropped"], call["callers_words_dropped"], call["phantom_transcripts"]) == (1, 0, 0)
    heard.events += dropped("b", 1200, 2.8, "What is the capital")
    call = figures(heard, [], front=True)
    assert (call["dropped"], call["callers_words_dropped"]) == (2, 1)
    assert call["callers_words_dropped_at"][0]["transcript"] == "What is the capital"
    heard.events.append((5 * RATE, {"type": "conversation.item.deleted", "item_id": "c"}))  # the client asked
    assert figures(heard, [], front=True)["dropped"] == 2
