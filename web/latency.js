// The latency bar under each answer: when the turn's milestones came, measured from the end of the user's
// speech, against the time-to-first-audio deadline. All bars share one scale, which grows to fit the
// slowest turn.

import { hook } from "./state.js";
import { fmtS } from "./ui.js";

// The server's timing keys are matched by what they name, so a renamed prefix does not break the bars.
const MILESTONES = [
  ["transcript", "seg-asr", "transcript", "ASR"],
  ["first_token", "seg-llm", "first token", "LLM"],
  ["first_sentence", "seg-sent", "first sentence", "sentence"],
  ["first_audio", "seg-tts", "first audio", "TTS"],
];

let latencyScale = 2; // seconds across a bar

function milestones(timings) {
  const out = [];
  if (!timings) return out;
  for (const [key, cls, label, short] of MILESTONES) {
    const k = Object.keys(timings).find((name) => name.includes(key));
    const v = k === undefined || timings[k] === null ? null : Number(timings[k]);
    if (v !== null && Number.isFinite(v)) out.push({ key, cls, label, short, at: v });
  }
  return out;
}

function deadlineS() {
  return Number(hook.session && hook.session.time_to_first_audio_deadline_s);
}

function badge(kind, text) {
  const el = document.createElement("span");
  el.className = `badge ${kind}`;
  el.textContent = text;
  return el;
}

/** Draw (or redraw) the bar of a finished turn {el, timings, deadline_met, underruns} inside turn.el. */
export function renderLatency(turn) {
  const ms = milestones(turn.timings);
  let box = turn.el.querySelector(".lat");
  if (!ms.length) {
    box?.remove();
    return;
  }
  if (!box) {
    box = document.createElement("div");
    box.className = "lat";
    turn.el.append(box);
  }
  box.replaceChildren();
  const track = document.createElement("div");
  track.className = "lat-track";
  let prev = 0;
  const parts = [];
  for (const m of ms) {
    const d = Math.max(0, m.at - prev);
    prev = Math.max(prev, m.at);
    const seg = document.createElement("span");
    seg.className = `seg ${m.cls}`;
    seg.style.width = `${Math.min(100, (100 * d) / latencyScale)}%`;
    seg.title = `${m.label}: ${m.at.toFixed(2)} s after the end of speech (+${d.toFixed(2)} s)`;
    track.append(seg);
    parts.push(`${m.short} ${fmtS(d)}`);
  }
  const deadline = deadlineS();
  if (deadline > 0 && deadline <= latencyScale) {
    const mark = document.createElement("i");
    mark.className = "lat-deadline";
    mark.style.left = `${(100 * deadline) / latencyScale}%`;
    mark.title = `time-to-first-audio deadline: ${fmtS(deadline)}`;
    track.append(mark);
  }
  const total = ms[ms.length - 1];
  const label = document.createElement("div");
  label.className = "lat-label";
  const strong = document.createElement("b");
  strong.textContent = `${fmtS(total.at)}`;
  const rest = document.createElement("span");
  rest.textContent = ` to ${total.label}`;
  label.append(strong, rest);
  if (turn.deadline_met === true || turn.deadline_met === false) {
    label.append(badge(turn.deadline_met ? "ok" : "late", turn.deadline_met ? "deadline met" : "deadline missed"));
  }
  if (turn.underruns > 0) {
    label.append(badge("late", `${turn.underruns} underrun${turn.underruns > 1 ? "s" : ""}`));
  }
  const detail = document.createElement("div");
  detail.className = "lat-detail";
  detail.textContent = parts.join(" \u00b7 ");
  box.append(label, track, detail);
}

/** Fit the shared scale to every turn so far and the deadline; true when it changed (redraw the bars). */
export function fitLatencyScale() {
  let slowest = 0;
  for (const t of hook.turns) for (const m of milestones(t.timings)) slowest = Math.max(slowest, m.at);
  const deadline = deadlineS() || 0;
  const scale = Math.max(2, Math.ceil(Math.max(slowest, deadline * 1.1) * 2) / 2);
  if (scale === latencyScale) return false;
  latencyScale = scale;
  return true;
}
