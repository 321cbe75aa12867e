// The scheduler panel's live charts, drawn from the server's scheduler.stats events: throughput, the
// make-up of recent steps against max_batch_tokens, queue depth per class, the KV pool, and deadlines.

import { cssVar, deadlineChart, forgetColors, lineChart, stackedBars } from "./charts.js";
import { hook } from "./state.js";
import { $ } from "./ui.js";

const SLOTS = 120; // chart history: about a minute at two stats events a second
const STEP_SLOTS = 60;
const CLASSES = [
  ["REALTIME", "--c-rt", "RT"],
  ["INTERACTIVE", "--c-ia", "IA"],
  ["BATCH", "--c-batch", "B"],
];
const history = { tps: [], usage: [], frag: [], queues: { REALTIME: [], INTERACTIVE: [], BATCH: [] } };
let steps = [];
let lastStepT = -Infinity;
let drawPending = false;

function push(arr, v, cap = SLOTS) {
  arr.push(v);
  if (arr.length > cap) arr.splice(0, arr.length - cap);
}

/** A scheduler.stats payload: kept as hook.stats, added to the charts' history, drawn on the next frame. */
export function onStats(stats) {
  hook.stats = stats;
  push(history.tps, Number(stats.tokens_per_s) || 0);
  const pool = stats.pool || {};
  push(history.usage, Number(pool.usage) || 0);
  push(history.frag, Number(pool.fragmentation) || 0);
  const q = stats.queues || {};
  for (const [cls] of CLASSES) {
    const c = q[cls] || {};
    push(history.queues[cls], (Number(c.waiting) || 0) + (Number(c.running) || 0));
  }
  for (const s of stats.steps || []) {
    if (typeof s.t === "number" && s.t > lastStepT) {
      steps.push(s);
      lastStepT = s.t;
    }
  }
  if (steps.length > STEP_SLOTS) steps = steps.slice(-STEP_SLOTS);
  const cfg = stats.config || {};
  $("sched-policy").textContent = cfg.policy ? `policy ${cfg.policy}` : "";
  scheduleDraw();
}

export function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    drawCharts();
  });
}

function drawCharts() {
  const stats = hook.stats || {};
  const tps = history.tps[history.tps.length - 1];
  $("v-tps").textContent = tps === undefined ? "\u2013" : `${tps.toFixed(tps < 10 ? 1 : 0)} tok/s`;
  lineChart($("c-tps"), { slots: SLOTS, series: [{ values: history.tps, color: cssVar("--accent"), fill: true }] });

  const cfg = stats.config || {};
  stackedBars($("c-steps"), {
    slots: STEP_SLOTS,
    bars: steps.map((s) => [Number(s.decode_tokens) || 0, Number(s.prefill_tokens) || 0]),
    colors: [cssVar("--c-decode"), cssVar("--c-prefill")],
    limit: Number(cfg.max_batch_tokens) || undefined,
  });
  const last = steps[steps.length - 1];
  $("v-steps").textContent = last
    ? `${last.decode_tokens} + ${last.prefill_tokens} tok, ${last.seqs ?? "?"} seq` +
      (last.rule && last.rule !== "open" ? ` (${last.rule.replace("_", " ")})` : "")
    : "idle";

  lineChart($("c-queues"), {
    slots: SLOTS,
    series: CLASSES.map(([cls, color]) => ({ values: history.queues[cls], color: cssVar(color) })),
  });
  const q = stats.queues || {};
  $("v-queues").textContent = CLASSES.map(([cls, , short]) => {
    const c = q[cls] || {};
    return `${short} ${c.running ?? 0}/${c.waiting ?? 0}`;
  }).join("  ");
  $("v-queues").title = "running/waiting per class";

  lineChart($("c-pool"), {
    slots: SLOTS,
    max: 1,
    unit: "%",
    series: [
      { values: history.usage, color: cssVar("--c-usage"), fill: true },
      { values: history.frag, color: cssVar("--c-frag") },
    ],
  });
  const pool = stats.pool || {};
  $("v-pool").textContent = pool.pages !== undefined
    ? `${pool.used}/${pool.pages} pages \u00b7 ${Math.round((pool.fragmentation || 0) * 100)}% frag`
    : "\u2013";
  drawDeadlines();
}

/** The deadline chart: all calls' hits and misses when the stats carry them, ticks for this call's turns. */
export function drawDeadlines() {
  const stats = hook.stats || {};
  const recent = hook.turns.filter((t) => t.deadline_met === true || t.deadline_met === false)
    .map((t) => t.deadline_met);
  let hit;
  let miss;
  if (stats.deadlines && typeof stats.deadlines === "object") {
    hit = Number(stats.deadlines.hit) || 0;
    miss = Number(stats.deadlines.miss) || 0;
    $("deadline-source").textContent = "bar: all calls \u00b7 ticks: this call";
  } else {
    hit = recent.filter(Boolean).length;
    miss = recent.length - hit;
    $("deadline-source").textContent = "this call";
  }
  deadlineChart($("c-deadlines"), { hit, miss, recent });
  const total = hit + miss;
  $("v-deadlines").textContent = total
    ? `${hit} met \u00b7 ${miss} missed (${Math.round((100 * hit) / total)}%)`
    : "none yet";
}

new ResizeObserver(() => scheduleDraw()).observe(document.querySelector(".charts"));
window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
  forgetColors();
  scheduleDraw();
});
