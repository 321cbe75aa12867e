// The scheduler's knobs (max_batch_tokens, max_batch_seqs): a logarithmic slider and a number box each.
// Their names come from the page's inputs (data-knob), their ranges and values from the server: the
// inputs stay disabled until the session announces the ranges (session.limits.scheduler), and show the
// engine's values as the session and the scheduler's stats report them. A change is sent as a
// session.update and confirmed by the session.updated that answers it.

import { sendJson } from "./connection.js";
import { sessionUpdate } from "./protocol.js";
import { hook } from "./state.js";
import { $ } from "./ui.js";

const knobs = {}; // name -> {range, number}
for (const input of document.querySelectorAll("#knobs [data-knob]")) {
  const k = (knobs[input.dataset.knob] ??= {});
  k[input.type === "range" ? "range" : "number"] = input;
}
const ranges = {}; // name -> [lo, hi], as the server announced them
let pendingKnobs = null; // sent, not yet confirmed or refused

/** The knobs the page has controls for. */
export const knobNames = Object.keys(knobs);

// The sliders are logarithmic: a range like a knob's spans too many orders of magnitude for a linear track.
function logBounds(name) {
  const [lo, hi] = ranges[name];
  return [lo, hi, Math.log(Math.max(1, lo)), Math.log(Math.max(lo + 1, hi))];
}

function toPos(name, v) {
  const [lo, hi, a, b] = logBounds(name);
  return Math.round((1000 * (Math.log(Math.min(hi, Math.max(lo, v))) - a)) / (b - a));
}

function fromPos(name, pos) {
  const [, , a, b] = logBounds(name);
  return Math.round(Math.exp(a + ((b - a) * pos) / 1000));
}

/** Take the ranges from the session's limits ({name: [lo, hi]}); a knob with a range is enabled. */
function setRanges(limits) {
  for (const [name, k] of Object.entries(knobs)) {
    const range = limits && limits[name];
    if (!(Array.isArray(range) && range.length === 2 && range.every((v) => Number.isFinite(Number(v))))) continue;
    ranges[name] = range.map(Number);
    k.number.min = String(ranges[name][0]);
    k.number.max = String(ranges[name][1]);
    k.number.disabled = k.range.disabled = false;
  }
}

function reflectKnobs(config, force = false) {
  for (const [name, k] of Object.entries(knobs)) {
    const v = Number(config[name]);
    if (!Number.isFinite(v)) continue;
    const editing = !force && (document.activeElement === k.number || k.range.dataset.dragging === "1");
    if (editing) continue;
    k.number.value = String(v);
    if (ranges[name]) k.range.value = String(toPos(name, v));
  }
}

function knobStatus(text, kind) {
  const el = $("knob-status");
  el.textContent = text;
  el.dataset.kind = kind || "";
}

/** Ask the server for new knob values ({name: value}); false when they are not whole numbers or the call
 * is down. */
export function sendKnobs(values) {
  const scheduler = {};
  for (const [name, v] of Object.entries(values)) {
    const n = Number(v);
    if (!Number.isInteger(n)) {
      knobStatus(`${name} must be a whole number`, "bad");
      return false;
    }
    scheduler[name] = n;
  }
  if (!sendJson(sessionUpdate(scheduler))) {
    knobStatus("not connected", "bad");
    return false;
  }
  pendingKnobs = scheduler;
  knobStatus("applying\u2026", "");
  return true;
}

/** A session.created (`created`) or session.updated: its limits give the ranges, its scheduler the values. */
export function fromSession(session, created) {
  setRanges(session.limits && session.limits.scheduler);
  if (!session.scheduler) return;
  hook.config = Object.assign({}, hook.config || {}, session.scheduler);
  if (!created && pendingKnobs) knobStatus("applied", "ok");
  pendingKnobs = null;
  reflectKnobs(hook.config);
}

/** The engine's configuration as a scheduler.stats reports it; ignored while a change is on its way. */
export function fromStats(config) {
  if (pendingKnobs || !knobNames.some((name) => config[name] !== undefined)) return;
  const seen = {};
  for (const name of knobNames) seen[name] = config[name] ?? hook.config?.[name];
  hook.config = Object.assign({}, hook.config || {}, seen);
  reflectKnobs(hook.config);
}

/** The server refused something: a change on its way was not applied, so show the engine's values again. */
export function refused(message) {
  if (!pendingKnobs) return;
  pendingKnobs = null;
  reflectKnobs(hook.config || {}, true);
  knobStatus(`not applied: ${message || "rejected"}`, "bad");
}

for (const [name, k] of Object.entries(knobs)) {
  k.number.disabled = k.range.disabled = true; // until the session gives the range
  k.range.addEventListener("pointerdown", () => (k.range.dataset.dragging = "1"));
  k.range.addEventListener("input", () => {
    k.number.value = String(fromPos(name, Number(k.range.value)));
  });
  k.range.addEventListener("change", () => {
    k.range.dataset.dragging = "";
    sendKnobs({ [name]: fromPos(name, Number(k.range.value)) });
  });
  k.number.addEventListener("change", () => {
    const v = Number(k.number.value);
    if (Number.isFinite(v)) k.range.value = String(toPos(name, v));
    sendKnobs({ [name]: k.number.value === "" ? NaN : v });
  });
}
$("knobs").addEventListener("submit", (e) => e.preventDefault());
