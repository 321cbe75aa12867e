// The latency bar under each answer: the turn's waterfall, each stage of the wait for its first audio as
// the server measured it, from the caller's last voiced frame (the caller's clock), against the
// time-to-first-audio deadline. All bars share one scale, which grows to fit the slowest turn.

import { hook } from "./state.js";
import { fmtS } from "./ui.js";

// The server's waterfall stages, in order: [key, css class, what it is, short label].
const STAGES = [
  ["pause", "seg-pause", "the pause that may end the turn was heard", "pause"],
  ["asr", "seg-asr", "the transcript of the words at the pause", "ASR"],
  ["decision", "seg-decision", "the end of the turn was decided", "decision"],
  ["prefill", "seg-llm", "the reply's prompt was read, its first token out", "prefill"],
  ["first_phrase", "seg-sent", "the first phrase of the reply was written", "phrase"],
  ["synthesis", "seg-tts", "the first phrase was synthesized", "TTS"],
  ["send", "seg-send", "its audio was sent", "send"],
];

let latencyScale = 2; // seconds across a bar

/** The stages of a turn's wait, each {key, cls, label, short, d (its seconds), at (when it ended)}. */
function stages(waterfall) {
  const out = [];
  if (!waterfall) return out;
  let at = 0;
  for (const [key, cls, label, short] of STAGES) {
    const d = Number(waterfall[key]);
    if (waterfall[key] === undefined || waterfall[key] === null || !Number.isFinite(d)) continue;
    at += d;
    out.push({ key, cls, label, short, d, at });
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
  const ms = stages(turn.waterfall);
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
  const parts = [];
  for (const m of ms) {
    const seg = document.createElement("span");
    seg.className = `seg ${m.cls}`;
    seg.style.width = `${Math.min(100, (100 * m.d) / latencyScale)}%`;
    seg.title = `${m.short}: ${m.label}, ${m.at.toFixed(2)} s after your last word (+${m.d.toFixed(2)} s)`;
    track.append(seg);
    parts.push(`${m.short} ${fmtS(m.d)}`);
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
  strong.dataset.seconds = String(total.at);
  const rest = document.createElement("span");
  rest.textContent = " from your last word to the first audio";
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
  for (const t of hook.turns) for (const m of stages(t.waterfall)) slowest = Math.max(slowest, m.at);
  const deadline = deadlineS() || 0;
  const scale = Math.max(2, Math.ceil(Math.max(slowest, deadline * 1.1) * 2) / 2);
  if (scale === latencyScale) return false;
  latencyScale = scale;
  return true;
}
