// The microphone as the person controls it: the Start talking button, the level meter, and the frames it
// sends up the call.

import { INPUT_RATE, Microphone } from "./audio.js";
import { sendAudio, whenConnected } from "./connection.js";
import { setPhase } from "./conversation.js";
import { ctx, hook, options } from "./state.js";
import { $, fmtRate, showError } from "./ui.js";

const UNREACHABLE = "the server cannot be reached";
let level = 0;

const mic = new Microphone(ctx, {
  raw: options.raw,
  onFrame(pcm, lv) {
    const db = 20 * Math.log10(Math.max(lv.rms, 1e-5));
    const v = Math.min(1, Math.max(0, (db + 60) / 60));
    level = Math.max(v, level);
    if (sendAudio(pcm)) {
      hook.framesSent++;
      hook.bytesSent += pcm.byteLength;
    }
  },
});

function micErrorText(err) {
  switch (err && err.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "The microphone was not allowed. Allow it in the browser's site settings and try again.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No microphone was found.";
    case "NotReadableError":
      return "The microphone is busy or could not be opened by the system.";
    default:
      return `Could not start the microphone: ${(err && err.message) || err}`;
  }
}

export function setMic(state) {
  hook.mic = state;
  const btn = $("talk");
  const on = state === "on";
  btn.dataset.active = String(on);
  btn.setAttribute("aria-pressed", String(on));
  btn.disabled = state === "starting";
  $("talk-label").textContent = on ? "Stop" : state === "starting" ? "Starting\u2026" : "Start talking";
  $("mic-state").textContent = on
    ? `listening (${options.raw ? "raw " : ""}mic ${fmtRate(ctx.sampleRate)} \u2192 ${fmtRate(INPUT_RATE)})`
    : state === "starting" ? "opening the microphone\u2026" : "microphone off";
}

export async function startTalking() {
  if (hook.mic !== "off") return;
  setMic("starting");
  try {
    if (ctx.state !== "running") await ctx.resume();
    if (!(await whenConnected())) throw new Error(UNREACHABLE);
    await mic.start();
    setMic("on");
  } catch (err) {
    setMic("off");
    showError(err instanceof Error && err.message === UNREACHABLE
      ? "The server cannot be reached; is `voicepipe serve` running?" : micErrorText(err));
  }
}

export function stopTalking() {
  mic.stop();
  setMic("off");
  setPhase("idle");
}

$("talk").addEventListener("click", () => (hook.mic === "on" ? stopTalking() : startTalking()));

function meterLoop() {
  $("meter-fill").style.transform = `scaleX(${hook.mic === "on" ? level : 0})`;
  level *= 0.88;
  requestAnimationFrame(meterLoop);
}
requestAnimationFrame(meterLoop);
