"""The browser client, end to end, in real headless Chromium.

The server runs in this process (its event loop in a thread) on a free loopback port, with the default models.
Chromium's fake microphone plays a WAV of a spoken question, so the whole path is exercised: capture and
resampling in the page's AudioWorklet, PCM16 frames over the websocket, VAD, ASR, LLM and TTS on the
server, and reply audio scheduled for playback in the page. The page exposes what it saw as
`window.voicepipe`; knob changes are checked on the server, in the engine's own configuration.

Screenshots go to test-artifacts/ (gitignored), for people to look at.
"""

import asyncio
import json
import os
import re
import shutil
import subprocess
import threading
import time
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
QUESTION = "What is the capital of France?"
SERVER_START_TIMEOUT_S = 300  # loading three models on a small CPU
TURN_TIMEOUT_MS = 180_000

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"{CHROMIUM} is missing (apt-get install chromium)")


def write_question_wav(path: Path) -> None:
    """The spoken question as 16-bit mono, with 0.5 s of silence before and 2 s after."""
    if shutil.which("espeak-ng"):
        raw = path.with_suffix(".espeak.wav")
        subprocess.run(["espeak-ng", "-w", str(raw), QUESTION], check=True, capture_output=True)
    else:  # the packaged recording of the same kind of question
        raw = ROOT / "voicepipe" / "samples" / "question.wav"
    with wave.open(str(raw)) as w:
        assert w.getsampwidth() == 2, "expected 16-bit audio"
        rate, channels = w.getframerate(), w.getnchannels()
        speech = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, channels)[:, 0]
    audio = np.concatenate([np.zeros(rate // 2, "<i2"), speech, np.zeros(2 * rate, "<i2")])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(audio.tobytes())


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("web") / "question.wav"
    write_question_wav(path)
    return path


@pytest.fixture(scope="module")
def server():
    """The voice server in this process, on a free loopback port, with the default models; its event loop
    runs in a background thread, so the test can also look at the engine itself."""
    from voicepipe.backends.loading import ModelOptions
    from voicepipe.call.runtime import Runtime
    from voicepipe.server import VoiceServer

    runtime = Runtime.load(ModelOptions())
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            box["server"] = VoiceServer(runtime)
            await box["server"].start("127.0.0.1", 0)

        try:
            loop.run_until_complete(start())
        except BaseException as e:  # reported by the fixture below
            box["error"] = e
            return
        finally:
            started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="voice-server", daemon=True)
    thread.start()
    try:
        if not started.wait(SERVER_START_TIMEOUT_S):
            pytest.fail(f"the server did not start within {SERVER_START_TIMEOUT_S} s")
        if "error" in box:
            raise box["error"]
        yield SimpleNamespace(url=box["server"].url, engine=runtime.engine.core)
    finally:
        if "server" in box:
            asyncio.run_coroutine_threadsafe(box["server"].close(), loop).result(30)
        asyncio.run_coroutine_threadsafe(runtime.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        if not loop.is_running():
            loop.close()


@pytest.fixture(scope="module")
def browser(question_wav):
    from playwright.sync_api import sync_playwright

    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={question_wav}%noloop",
            "--autoplay-policy=no-user-gesture-required"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url: str, width: int = 1280, height: int = 860):
    page = browser.new_page(viewport={"width": width, "height": height})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: problems.append(f"console error: {m.text}") if m.type == "error" else None)
    page.goto(url)
    page.wait_for_function("window.voicepipe && window.voicepipe.state === 'connected' && window.voicepipe.session",
                           timeout=20_000)
    return page, problems


def hook(page) -> dict:
    return page.evaluate("JSON.parse(JSON.stringify(window.voicepipe))")


def wait_for_engine(engine, want: dict, timeout_s: float = 10.0) -> dict:
    """The engine's knobs once they equal `want` (they are applied between steps), or as they are when
    the time runs out."""
    end = time.monotonic() + timeout_s
    while True:
        now = {k: getattr(engine.config, k) for k in want}
        if now == want or time.monotonic() > end:
            return now
        time.sleep(0.05)


def test_spoken_question_is_answered_in_the_page(server, browser):
    page, problems = open_page(browser, server.url + "/?raw=1")
    try:
        state = hook(page)
        # Made at load, the AudioContext runs without a click under this autoplay policy, at the device's rate.
        assert state["contextState"] == "running"
        assert state["contextSampleRate"] in (44100, 48000, 16000, 22050, 24000, 32000, 96000)
        page.click("#talk")
        page.wait_for_function("window.voicepipe.mic === 'on'", timeout=10_000)
        page.wait_for_function("window.voicepipe.answers.length > 0 && window.voicepipe.audioScheduledSeconds > 0",
                               timeout=TURN_TIMEOUT_MS)
        page.wait_for_timeout(1500)  # let the charts take a few more stats events
        state = hook(page)

        assert state["framesSent"] > 100  # ~2 s of 20 ms frames at least
        transcript = " ".join(state["transcripts"]).lower()
        assert "capital" in transcript and "france" in transcript, state["transcripts"]
        assert state["answers"][0].strip(), "the answer is empty"
        assert state["audioScheduledSeconds"] > 0.2
        assert state["audioChunks"] >= 1
        assert state["lastError"] is None, state["lastError"]
        turn = state["turns"][0]
        assert turn["status"] == "completed"
        assert turn["timings"], "response.done carried no timings"

        # What a person sees: their words, the answer, and the turn's latency bar.
        assert "capital" in page.inner_text(".msg.user").lower()
        assert page.inner_text(".msg.assistant .text").strip() == state["answers"][0].strip()
        assert page.locator(".msg.assistant .lat .seg").count() >= 2
        # The bar adds up the server's waterfall: the wait from the caller's last word, stage by stage.
        shown = float(page.get_attribute(".msg.assistant .lat-label b", "data-seconds"))
        assert abs(shown - sum(turn["waterfall"].values())) < 1e-6 and shown > 0
        assert page.locator(".msg.assistant .lat .seg-asr").count() == 1
        assert state["stats"] and "queues" in state["stats"], "no scheduler.stats reached the page"
        # The page turns the server's canceller off (the browser's runs) and says so.
        assert state["echoState"]["canceller"] == "off" and not state["echoState"]["echo_cancellation"]

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-after-turn.png"))
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(400)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, "the page overflows a phone screen"
        page.screenshot(path=str(ARTIFACTS / "web-after-turn-phone.png"), full_page=True)
        page.click("#talk")
        assert hook(page)["mic"] == "off"
        assert not problems, problems
    finally:
        page.close()


def test_knobs_change_the_engine(server, browser):
    page, problems = open_page(browser, server.url + "/")
    try:
        config = hook(page)["config"]
        before = {k: config[k] for k in ("max_batch_tokens", "max_batch_seqs")}
        assert before["max_batch_tokens"] >= 1 and before["max_batch_seqs"] >= 1
        want = {"max_batch_tokens": 384 if before["max_batch_tokens"] != 384 else 320,
                "max_batch_seqs": 12 if before["max_batch_seqs"] != 12 else 10}
        page.fill("#k-tokens", str(want["max_batch_tokens"]))
        page.press("#k-tokens", "Enter")
        page.wait_for_function(f"window.voicepipe.config.max_batch_tokens === {want['max_batch_tokens']}",
                               timeout=10_000)
        # The slider: move it with the keyboard, as a person without a mouse would.
        page.focus("#k-seqs-range")
        page.keyboard.press("End")  # to the top of its range, then type the exact value
        page.wait_for_function("window.voicepipe.config.max_batch_seqs > 32", timeout=10_000)
        page.fill("#k-seqs", str(want["max_batch_seqs"]))
        page.press("#k-seqs", "Enter")
        page.wait_for_function(f"window.voicepipe.config.max_batch_seqs === {want['max_batch_seqs']}",
                               timeout=10_000)
        assert page.inner_text("#knob-status").strip() == "applied"

        # Server side: the engine itself runs with the new knobs, and the page's charts hear of it.
        assert wait_for_engine(server.engine, want) == want
        page.wait_for_function(f"window.voicepipe.stats?.config?.max_batch_tokens === {want['max_batch_tokens']}",
                               timeout=10_000)

        # A value the server refuses is reported in words, and the control returns to the engine's value.
        page.fill("#k-tokens", "0")
        page.press("#k-tokens", "Enter")
        page.wait_for_function("window.voicepipe.lastError !== null", timeout=10_000)
        assert page.is_visible("#error-banner")
        assert page.inner_text("#error-text").strip()
        assert page.input_value("#k-tokens") == str(want["max_batch_tokens"])
        assert wait_for_engine(server.engine, want, timeout_s=1.0) == want

        # Leave the engine as it was for whatever runs next.
        page.evaluate(f"window.voicepipe.setKnobs({json.dumps(before)})")
        page.wait_for_function(f"window.voicepipe.config.max_batch_tokens === {before['max_batch_tokens']}",
                               timeout=10_000)
        assert wait_for_engine(server.engine, before) == before
        errors = [p for p in problems if "page error" in p]
        assert not errors, errors
    finally:
        page.close()


# Each knob's number box and slider, as the page shows them.
KNOB_INPUTS = """() => Object.fromEntries([...document.querySelectorAll('#knobs input[type=number]')].map((box) => {
  const slider = document.querySelector(`#knobs input[type=range][data-knob="${box.dataset.knob}"]`);
  return [box.dataset.knob, {min: box.min, max: box.max, value: box.value, disabled: box.disabled,
                             sliderDisabled: slider.disabled}];
}))"""
NO_WEBSOCKET = "window.WebSocket = class { constructor() { this.readyState = 0; } send() {} close() {} };"


def test_knob_ranges_come_from_the_session(server, browser):
    """The page repeats no knob range: the inputs wait, disabled, until a session announces its limits."""
    page, problems = open_page(browser, server.url + "/")
    try:
        state = hook(page)
        limits = state["session"]["limits"]["scheduler"]
        inputs = page.evaluate(KNOB_INPUTS)
        assert set(inputs) == set(limits) == {"max_batch_tokens", "max_batch_seqs"}
        for name, (lo, hi) in limits.items():
            assert (inputs[name]["min"], inputs[name]["max"]) == (str(lo), str(hi)), name
            assert not inputs[name]["disabled"] and not inputs[name]["sliderDisabled"], name
            assert inputs[name]["value"] == str(state["config"][name]), name
        assert not problems, problems
    finally:
        page.close()

    page = browser.new_page()  # a call that never connects: no session, so no ranges
    problems = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.add_init_script(NO_WEBSOCKET)
    try:
        page.goto(server.url + "/")
        page.wait_for_function("window.voicepipe && window.voicepipe.state === 'connecting'", timeout=20_000)
        for name, knob in page.evaluate(KNOB_INPUTS).items():
            assert knob["disabled"] and knob["sliderDisabled"], name
            assert knob["min"] == knob["max"] == knob["value"] == "", name
        page.evaluate("""() => window.voicepipe.receive({type: "session.created", session: {
            scheduler: {policy: "o4", max_batch_tokens: 100, max_batch_seqs: 7},
            limits: {scheduler: {max_batch_tokens: [2, 300], max_batch_seqs: [3, 40]}}}})""")
        inputs = page.evaluate(KNOB_INPUTS)
        assert inputs["max_batch_tokens"] == {"min": "2", "max": "300", "value": "100", "disabled": False,
                                              "sliderDisabled": False}
        assert inputs["max_batch_seqs"] == {"min": "3", "max": "40", "value": "7", "disabled": False,
                                            "sliderDisabled": False}
        assert not problems, problems
    finally:
        page.close()


# Two seconds of reply audio for a response, then the barge-in clear, then the rest of it (a backchannel
# did not really interrupt it).
BARGE_IN = """() => {
  const vp = window.voicepipe;
  const rate = vp.outputSampleRate;
  const chunk = () => {
    vp.receive({type: "response.audio.delta", response_id: "resp_web_test", bytes: 2 * rate, sample_rate: rate});
    vp.receive(new Int16Array(rate).fill(800).buffer);
  };
  vp.receive({type: "response.created", response: {id: "resp_web_test"}});
  chunk();
  chunk();
  const queued = vp.audioBufferedSeconds;
  vp.receive({type: "output_audio_buffer.cleared", response_id: "resp_web_test"});
  const afterClear = {buffered: vp.audioBufferedSeconds, playing: vp.playing};
  chunk();
  return {queued, afterClear, late: vp.audioBufferedSeconds, chunks: vp.audioChunks};
}"""


def test_barge_in_drops_queued_playback_at_once(server, browser):
    """The page's side of barge-in, fed the server's messages directly so the timing is exact; and the
    Interrupt button, which cuts playback here and asks the real server to cancel."""
    page, problems = open_page(browser, server.url + "/")
    try:
        result = page.evaluate(BARGE_IN)
        assert result["queued"] > 1.5
        assert result["afterClear"] == {"buffered": 0, "playing": False}
        # What the server sends after a clear is the rest of a reply the caller did not really interrupt.
        assert result["late"] > 0.5 and result["chunks"] == 3, "the resumed rest of a reply was not played"
        page.evaluate("""() => window.voicepipe.receive({type: "response.done",
                         response: {id: "resp_web_test", status: "cancelled"}})""")
        assert page.inner_text(".msg.assistant .tag") == "interrupted"

        page.evaluate("""() => {
          const vp = window.voicepipe;
          vp.receive({type: "response.audio.delta", response_id: "resp_other", bytes: 2 * 22050, sample_rate: 22050});
          vp.receive(new Int16Array(22050).fill(800).buffer);
        }""")
        page.click("#interrupt")
        assert page.evaluate("window.voicepipe.audioBufferedSeconds") == 0
        page.wait_for_timeout(500)  # the server takes response.cancel with nothing to cancel quietly
        assert hook(page)["lastError"] is None
        assert not problems, problems
    finally:
        page.close()


def test_an_utterance_taken_for_the_assistants_own_voice_leaves_the_page(server, browser):
    """Fed the server's messages directly: the echo's bubble, opened at speech_started, goes when the
    server drops its item; the caller's words beside it stay."""
    page, problems = open_page(browser, server.url + "/")
    try:
        page.evaluate("""() => {
          const vp = window.voicepipe;
          for (const id of ["item_echo", "item_caller"]) {
            vp.receive({type: "input_audio_buffer.speech_started", item_id: id, audio_start_ms: 0});
            vp.receive({type: "input_audio_buffer.speech_stopped", item_id: id, audio_end_ms: 900});
          }
          vp.receive({type: "conversation.item.input_audio_transcription.completed", item_id: "item_caller",
                      transcript: "What about trains?"});
          vp.receive({type: "conversation.item.deleted", item_id: "item_echo", reason: "own_voice",
                      transcript: "Thank you."});
        }""")
        assert page.locator(".msg.user").count() == 1
        assert page.inner_text(".msg.user .text") == "What about trains?"
        state = hook(page)
        assert state["dropped"] == [{"reason": "own_voice", "transcript": "Thank you."}]
        assert state["transcripts"] == ["What about trains?"]
        assert not problems, problems
    finally:
        page.close()


def test_the_turn_taking_mode_is_chosen_on_the_page(server, browser):
    page, problems = open_page(browser, server.url + "/")
    try:
        hook(page)
        assert page.input_value("#turn-mode") == "semantic_vad:auto"  # the server's default, as it reported it
        assert not page.is_visible("#reply")
        page.select_option("#turn-mode", "manual")
        page.wait_for_function("window.voicepipe.session.turn_detection === null", timeout=10_000)
        assert page.is_visible("#reply")  # manual turns: the caller ends them
        page.select_option("#turn-mode", "server_vad")
        page.wait_for_function("window.voicepipe.session.turn_detection?.type === 'server_vad'", timeout=10_000)
        assert page.evaluate("window.voicepipe.session.turn_detection.silence_duration_ms") == 500
        assert not page.is_visible("#reply") and not problems, problems
    finally:
        page.close()


def test_the_calculator_tool_is_called_run_in_the_page_and_its_result_spoken(server, browser):
    page, problems = open_page(browser, server.url + "/")
    try:
        page.check("#calculator")
        page.wait_for_function("window.voicepipe.session.tool_choice === 'required' && "
                               "window.voicepipe.session.tools[0]?.name === 'calculator'", timeout=10_000)
        page.evaluate("""() => {
            window.voicepipe.send({type: "conversation.item.create", item: {type: "message", role: "user",
                content: [{type: "input_text", text: "What is 37 times 43?"}]}});
            window.voicepipe.send({type: "response.create"});
        }""")
        page.wait_for_function("window.voicepipe.calls.length === 1 && window.voicepipe.answers.length === 2",
                               timeout=TURN_TIMEOUT_MS)
        state = hook(page)
        (call,) = state["calls"]
        number = r"-?[0-9]{1,9}([.][0-9]{1,6})?"
        assert re.fullmatch(rf"{number}( ?[-+*/] ?{number}){{1,4}}", call["expression"]), call
        assert float(call["output"]) == pytest.approx(eval(call["expression"]))  # the pattern allows no names
        assert state["answers"][1].strip() and state["audioScheduledSeconds"] > 0  # the answer is spoken
        assert "calculator(" in page.inner_text(".msg.assistant .tool-call")
        page.wait_for_function("window.voicepipe.session.tool_choice === 'required'", timeout=10_000)
        page.uncheck("#calculator")
        page.wait_for_function("window.voicepipe.session.tools.length === 0", timeout=10_000)
        assert not problems, problems
    finally:
        page.close()
