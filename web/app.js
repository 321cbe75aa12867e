// The voicepipe call page: microphone up, reply audio down, a chat log with per-turn latency bars, and a
// live view of the mini-O4 scheduler with its two knobs.
//
// Query parameters: raw=1 turns off echo cancellation, noise suppression and auto gain (for tests that
// compare signals); autostart=1 opens the microphone at load; ws=URL picks another websocket path of this
// same server (other hosts are ignored: a link must not send your microphone elsewhere); key=KEY passes
// the server's API key to the call.

import { audioContext, FRAME_SAMPLES, INPUT_RATE, Microphone, Player } from "./audio.js";
import { cssVar, deadlineChart, forgetColors, lineChart, stackedBars } from "./charts.js";

const params = new URLSearchParams(location.search);
const RAW = params.get("raw") === "1";
const AUTOSTART = params.get("autostart") === "1";
const WS_URL = callUrl(params.get("ws"), params.get("key"));
const SLOTS = 120; // chart history: about a minute at two stats events a second
const STEP_SLOTS = 60;
// Fallback knob ranges; the server's own come with the session (limits) when it announces them.
const KNOB_RANGES = { max_batch_tokens: [1, 8192], max_batch_seqs: [1, 1024] };

function callUrl(asked, key) {
  const own = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
  let url = new URL(own);
  if (asked) {
    const wanted = new URL(asked, own);
    if (wanted.host === location.host && (wanted.protocol === "ws:" || wanted.protocol === "wss:")) url = wanted;
    else console.warn(`ignoring ws=${asked}: not this page's own server`);
  }
  if (key) url.searchParams.set("api_key", key);
  return url.toString();
}

const $ = (id) => document.getElementById(id);
const ctx = audioContext();
const player = new Player(ctx);

// ---- the test hook: what the page saw, as plain data ---------------------------------------------------
const hook = {
  state: "disconnected", // websocket: connecting | connected | disconnected
  mic: "off", // off | starting | on
  phase: "idle", // idle | hearing | thinking | speaking
  raw: RAW,
  contextSampleRate: ctx.sampleRate,
  inputSampleRate: INPUT_RATE,
  outputSampleRate: 22050,
  session: null,
  transcripts: [], // final transcripts, in order
  partials: [], // every partial transcript text seen
  answers: [], // the assistant's full answer per finished response
  turns: [], // {response_id, status, transcript, text, timings, deadline_met, underruns}
  audioScheduledSeconds: 0,
  audioChunks: 0,
  audioBytes: 0,
  playbackGaps: 0,
  framesSent: 0,
  bytesSent: 0,
  cleared: 0,
  events: {}, // count per server event type
  stats: null, // the last scheduler.stats payload
  config: null, // the knobs as the server last confirmed them
  lastError: null,
  errors: [],
  start: () => startTalking(),
  stop: () => stopTalking(),
  cancel: () => cancelResponse(),
  setKnobs: (knobs) => sendKnobs(knobs),
  send: (obj) => sendJson(obj),
  // Hand the page a message as if the server had sent it: an event object or a PCM16 ArrayBuffer.
  receive(msg) {
    if (msg instanceof ArrayBuffer) onAudio(msg);
    else onEvent(typeof msg === "string" ? JSON.parse(msg) : msg);
  },
};
Object.defineProperties(hook, {
  audioBufferedSeconds: { enumerable: true, get: () => player.buffered },
  playing: { enumerable: true, get: () => player.playing },
  contextState: { enumerable: true, get: () => ctx.state },
});
window.voicepipe = hook;

// ---- errors --------------------------------------------------------------------------------------------
function showError(message, code) {
  const text = code ? `${message} (${code})` : message;
  hook.lastError = { message, code: code || null, at: Date.now() };
  hook.errors.push(hook.lastError);
  $("error-text").textContent = text;
  $("error-banner").hidden = false;
}
$("error-close").addEventListener("click", () => {
  $("error-banner").hidden = true;
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

// ---- websocket ---------------------------------------------------------------------------------------
let ws = null;
let backoff = 500;
let reconnectTimer = null;
let openWaiters = [];
let idleClosed = false; // the server closed an idle call: wait for the user before calling again

function setConn(state, detail) {
  hook.state = state;
  const el = $("conn");
  el.dataset.state = state;
  $("conn-text").textContent = detail || state;
}

function connect() {
  clearTimeout(reconnectTimer);
  idleClosed = false;
  setConn("connecting");
  let sock;
  try {
    sock = new WebSocket(WS_URL);
  } catch (err) {
    setConn("disconnected");
    showError(`Cannot open the connection to ${WS_URL}: ${err.message}`);
    return;
  }
  ws = sock;
  sock.binaryType = "arraybuffer";
  sock.onopen = () => {
    backoff = 500;
    setConn("connected");
    openWaiters.forEach((f) => f(true));
    openWaiters = [];
  };
  sock.onmessage = (e) => {
    if (typeof e.data === "string") {
      let ev;
      try {
        ev = JSON.parse(e.data);
      } catch {
        showError("The server sent a message that is not JSON.");
        return;
      }
      onEvent(ev);
    } else {
      onAudio(e.data);
    }
  };
  sock.onclose = (e) => {
    if (ws !== sock) return;
    ws = null;
    openWaiters.forEach((f) => f(false));
    openWaiters = [];
    player.clear();
    const why = e.reason ? `: ${e.reason}` : "";
    if (e.code !== 1000 && e.code !== 1001) {
      showError(`The connection to the server closed (code ${e.code}${why}); reconnecting.`);
    }
    if (idleClosed) {
      setConn("disconnected", "idle \u2013 click to reconnect");
      return;
    }
    setConn("disconnected", `disconnected, retrying in ${Math.round(backoff / 100) / 10} s`);
    reconnectTimer = setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 8000);
  };
}

$("conn").addEventListener("click", () => {
  if (!ws) connect();
});

function whenConnected(timeoutMs = 10000) {
  if (ws && ws.readyState === WebSocket.OPEN) return Promise.resolve(true);
  if (!ws) connect();
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), timeoutMs);
    openWaiters.push((ok) => {
      clearTimeout(t);
      resolve(ok);
    });
  });
}

function sendJson(obj) {
  if (!ws || ws.readyState !== WebSocket.OPEN) {
    showError("Not connected to the server.");
    return false;
  }
  ws.send(JSON.stringify(obj));
  return true;
}

// ---- microphone --------------------------------------------------------------------------------------
let level = 0;
const mic = new Microphone(ctx, {
  raw: RAW,
  onFrame(pcm, lv) {
    const db = 20 * Math.log10(Math.max(lv.rms, 1e-5));
    const v = Math.min(1, Math.max(0, (db + 60) / 60));
    level = Math.max(v, level);
    if (ws && ws.readyState === WebSocket.OPEN && ws.bufferedAmount < 1 << 20) {
      ws.send(pcm);
      hook.framesSent++;
      hook.bytesSent += pcm.byteLength;
    }
  },
});

function setMic(state) {
  hook.mic = state;
  const btn = $("talk");
  const on = state === "on";
  btn.dataset.active = String(on);
  btn.setAttribute("aria-pressed", String(on));
  btn.disabled = state === "starting";
  $("talk-label").textContent = on ? "Stop" : state === "starting" ? "Starting\u2026" : "Start talking";
  $("mic-state").textContent = on ? `listening (${RAW ? "raw " : ""}mic ${fmtRate(ctx.sampleRate)} \u2192 16 kHz)`
    : state === "starting" ? "opening the microphone\u2026" : "microphone off";
}

async function startTalking() {
  if (hook.mic !== "off") return;
  setMic("starting");
  try {
    if (ctx.state !== "running") await ctx.resume();
    if (!(await whenConnected())) throw new Error("the server cannot be reached");
    await mic.start();
    setMic("on");
  } catch (err) {
    setMic("off");
    showError(err instanceof Error && err.message === "the server cannot be reached"
      ? "The server cannot be reached; is `voicepipe serve` running?" : micErrorText(err));
  }
}

function stopTalking() {
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

// ---- conversation log ----------------------------------------------------------------------------------
const log = $("log");
const userItems = new Map(); // item_id -> bubble
const replies = new Map(); // response_id -> {el, text, ...}
let pendingUser = null; // a bubble opened on speech_started, before its item id is known
let currentResponse = null;
let pendingAudio = null; // the response.audio.delta announcing the next binary frame
const droppedResponses = new Set();
let latencyScale = 2; // seconds across a latency bar; grows to fit the slowest turn

function stickToBottom(fn) {
  const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  fn();
  if (atBottom) log.scrollTop = log.scrollHeight;
}

function bubble(role) {
  $("log-empty")?.remove();
  const li = document.createElement("li");
  li.className = `msg ${role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Assistant";
  const text = document.createElement("div");
  text.className = "text";
  li.append(who, text);
  stickToBottom(() => log.append(li));
  return li;
}

function userBubble(itemId) {
  let li = userItems.get(itemId);
  if (!li) {
    li = pendingUser || bubble("user");
    pendingUser = null;
    userItems.set(itemId, li);
  }
  return li;
}

function setPhase(phase) {
  hook.phase = phase;
  const el = $("speech-state");
  el.dataset.phase = phase;
  el.textContent = { idle: "", hearing: "hearing you", thinking: "thinking", speaking: "speaking" }[phase];
  $("interrupt").hidden = !(phase === "speaking" || (currentResponse && phase === "thinking") || player.playing);
}

// Stop the reply now: playback is cut here at once, and the server is asked to cancel the response
// (which it ignores when the response has already been fully sent).
function cancelResponse() {
  if (currentResponse) droppedResponses.add(currentResponse);
  player.clear();
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "response.cancel" }));
  setPhase(currentResponse ? "thinking" : "idle");
}
$("interrupt").addEventListener("click", cancelResponse);

// Milestones of a turn, measured from the end of the user's speech. The server's keys are matched by
// what they name, so a renamed prefix does not break the bars.
const MILESTONES = [
  ["transcript", "seg-asr", "transcript", "ASR"],
  ["first_token", "seg-llm", "first token", "LLM"],
  ["first_sentence", "seg-sent", "first sentence", "sentence"],
  ["first_audio", "seg-tts", "first audio", "TTS"],
];

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

function renderLatency(turn) {
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
  const deadline = Number(hook.session && hook.session.time_to_first_audio_deadline_s);
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
    const badge = document.createElement("span");
    badge.className = `badge ${turn.deadline_met ? "ok" : "late"}`;
    badge.textContent = turn.deadline_met ? "deadline met" : "deadline missed";
    label.append(badge);
  }
  if (turn.underruns > 0) {
    const badge = document.createElement("span");
    badge.className = "badge late";
    badge.textContent = `${turn.underruns} underrun${turn.underruns > 1 ? "s" : ""}`;
    label.append(badge);
  }
  const detail = document.createElement("div");
  detail.className = "lat-detail";
  detail.textContent = parts.join(" \u00b7 ");
  box.append(label, track, detail);
}

function rescaleLatency() {
  let slowest = 0;
  for (const t of hook.turns) for (const m of milestones(t.timings)) slowest = Math.max(slowest, m.at);
  const deadline = Number(hook.session && hook.session.time_to_first_audio_deadline_s) || 0;
  const scale = Math.max(2, Math.ceil(Math.max(slowest, deadline * 1.1) * 2) / 2);
  if (scale !== latencyScale) {
    latencyScale = scale;
    for (const r of replies.values()) if (r.turn) renderLatency(r.turn);
  }
}

function fmtS(s) {
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

function fmtRate(hz) {
  return `${(hz / 1000).toFixed(hz % 1000 ? 2 : 0).replace(/\.?0+$/, "")} kHz`;
}

// ---- server events -------------------------------------------------------------------------------------
function onEvent(ev) {
  const type = ev && ev.type;
  if (typeof type !== "string") return;
  hook.events[type] = (hook.events[type] || 0) + 1;
  const handler = handlers[type];
  if (handler) handler(ev);
}

const handlers = {
  "session.created"(ev) {
    applySession(ev.session || {}, true);
  },
  "session.updated"(ev) {
    applySession(ev.session || {}, false);
  },
  "input_audio_buffer.speech_started"(ev) {
    if (!(ev.item_id && userItems.has(ev.item_id))) {
      const li = pendingUser || bubble("user");
      li.classList.add("partial");
      li.querySelector(".text").textContent = "\u2026";
      if (ev.item_id) userItems.set(ev.item_id, li);
      else pendingUser = li;
    }
    setPhase("hearing");
  },
  "input_audio_buffer.speech_stopped"() {
    setPhase("thinking");
  },
  "conversation.item.input_audio_transcription.delta"(ev) {
    const li = userBubble(ev.item_id);
    const text = li.querySelector(".text");
    const partial = typeof ev.partial === "string" ? ev.partial
      : (text.dataset.partial || "") + (ev.delta || "");
    text.dataset.partial = partial;
    li.classList.add("partial");
    stickToBottom(() => {
      text.textContent = partial || "\u2026";
    });
    hook.partials.push(partial);
  },
  "conversation.item.input_audio_transcription.completed"(ev) {
    const li = userBubble(ev.item_id);
    const transcript = (ev.transcript || "").trim();
    if (!transcript) {
      li.remove();
      userItems.delete(ev.item_id);
      return;
    }
    li.classList.remove("partial");
    stickToBottom(() => {
      li.querySelector(".text").textContent = transcript;
    });
    hook.transcripts.push(transcript);
  },
  "response.created"(ev) {
    const id = ev.response && ev.response.id;
    const li = bubble("assistant");
    li.classList.add("streaming");
    replies.set(id, { el: li, text: "", transcript: hook.transcripts[hook.transcripts.length - 1] || "" });
    currentResponse = id;
    setPhase("thinking");
  },
  "response.text.delta"(ev) {
    const r = replies.get(ev.response_id);
    if (!r) return;
    r.text += ev.delta || "";
    stickToBottom(() => {
      r.el.querySelector(".text").textContent = r.text;
    });
  },
  "response.audio.delta"(ev) {
    pendingAudio = ev;
  },
  "response.audio.done"() {},
  "response.done"(ev) {
    const resp = ev.response || {};
    const r = replies.get(resp.id);
    const turn = {
      response_id: resp.id,
      status: resp.status || "completed",
      transcript: r ? r.transcript : "",
      text: r ? r.text : "",
      timings: resp.timings || ev.timings || null,
      deadline_met: resp.deadline_met ?? ev.deadline_met ?? null,
      underruns: resp.underruns ?? ev.underruns ?? 0,
      el: r ? r.el : null,
    };
    hook.turns.push(Object.assign({}, turn, { el: undefined }));
    hook.answers.push(turn.text);
    if (r) {
      r.turn = turn;
      r.el.classList.remove("streaming");
      if (turn.status !== "completed") {
        r.el.classList.add("cancelled");
        const tag = document.createElement("span");
        tag.className = "tag";
        tag.textContent = turn.status === "cancelled" ? "interrupted" : turn.status;
        r.el.querySelector(".who").append(tag);
      }
      if (!r.text) r.el.querySelector(".text").textContent = "(no answer)";
      rescaleLatency();
      stickToBottom(() => renderLatency(turn));
    }
    if (currentResponse === resp.id) currentResponse = null;
    if (hook.phase !== "hearing") setPhase(player.playing ? "speaking" : "idle");
    drawDeadlines();
  },
  "output_audio_buffer.cleared"(ev) {
    hook.cleared++;
    const rid = ev.response_id || currentResponse;
    if (rid) droppedResponses.add(rid);
    pendingAudio = null;
    player.clear();
    if (hook.phase === "speaking") setPhase("idle");
  },
  "scheduler.stats"(ev) {
    onStats(ev.stats || {});
  },
  error(ev) {
    const e = ev.error || {};
    if (e.code === "idle_timeout" && hook.mic !== "on") {
      idleClosed = true; // not a fault: the page sat unused; it reconnects when asked to
      hook.errors.push({ message: e.message, code: e.code, at: Date.now() });
      return;
    }
    showError(e.message || "The server reported an error.", e.code || e.type);
    if (pendingKnobs) {
      pendingKnobs = null;
      reflectKnobs(hook.config || {}, true);
      knobStatus(`not applied: ${e.message || "rejected"}`, "bad");
    }
  },
};

function onAudio(data) {
  const meta = pendingAudio;
  pendingAudio = null;
  const rid = meta ? meta.response_id : currentResponse;
  if (rid && droppedResponses.has(rid)) return;
  const rate = (meta && meta.sample_rate) || hook.outputSampleRate;
  const continuing = player.playing;
  const seconds = player.enqueue(data, rate, continuing);
  hook.audioScheduledSeconds += seconds;
  hook.audioChunks++;
  hook.audioBytes += data.byteLength;
  hook.playbackGaps = player.gaps;
  if (hook.phase !== "hearing") setPhase("speaking");
}

// Return the page to idle once queued reply audio has played out.
setInterval(() => {
  if (hook.phase === "speaking" && !player.playing && !currentResponse) setPhase("idle");
  else if (hook.phase === "speaking" && !player.playing && player.buffered === 0) setPhase("thinking");
}, 250);

function applySession(session, created) {
  if (created) {
    hook.session = session;
  } else {
    hook.session = Object.assign({}, hook.session || {}, session);
  }
  const s = hook.session;
  const rate = s.output_audio_format && s.output_audio_format.sample_rate;
  if (rate) hook.outputSampleRate = rate;
  const limits = s.limits || {};
  for (const name of Object.keys(KNOB_RANGES)) {
    const range = limits[name] || (limits.scheduler && limits.scheduler[name]);
    if (Array.isArray(range) && range.length === 2) KNOB_RANGES[name] = range.map(Number);
    else if (range && typeof range === "object" && "min" in range && "max" in range) {
      KNOB_RANGES[name] = [Number(range.min), Number(range.max)];
    }
  }
  setupKnobRanges();
  if (s.scheduler) {
    hook.config = Object.assign({}, hook.config || {}, s.scheduler);
    if (!created && pendingKnobs) knobStatus("applied", "ok");
    pendingKnobs = null;
    reflectKnobs(hook.config);
  }
  $("session-info").textContent = s.id ? `session ${String(s.id).slice(0, 12)}` : "";
  $("rates").textContent = `mic ${fmtRate(ctx.sampleRate)} \u2192 ${fmtRate(INPUT_RATE)} PCM16, `
    + `${FRAME_SAMPLES / (INPUT_RATE / 1000)} ms frames \u00b7 reply ${fmtRate(hook.outputSampleRate)} PCM16`;
}

// ---- knobs -------------------------------------------------------------------------------------------
let pendingKnobs = null;
const knobs = {
  max_batch_tokens: { range: $("k-tokens-range"), number: $("k-tokens") },
  max_batch_seqs: { range: $("k-seqs-range"), number: $("k-seqs") },
};

// The sliders are logarithmic: 1..8192 spans too many orders of magnitude for a linear track.
function toPos(name, v) {
  const [lo, hi] = KNOB_RANGES[name];
  const a = Math.log(Math.max(1, lo));
  const b = Math.log(Math.max(lo + 1, hi));
  return Math.round((1000 * (Math.log(Math.min(hi, Math.max(lo, v))) - a)) / (b - a));
}

function fromPos(name, pos) {
  const [lo, hi] = KNOB_RANGES[name];
  const a = Math.log(Math.max(1, lo));
  const b = Math.log(Math.max(lo + 1, hi));
  return Math.round(Math.exp(a + ((b - a) * pos) / 1000));
}

function setupKnobRanges() {
  for (const [name, k] of Object.entries(knobs)) {
    k.number.min = KNOB_RANGES[name][0];
    k.number.max = KNOB_RANGES[name][1];
  }
}

function reflectKnobs(config, force = false) {
  for (const [name, k] of Object.entries(knobs)) {
    const v = Number(config[name]);
    if (!Number.isFinite(v)) continue;
    const editing = !force && (document.activeElement === k.number || k.range.dataset.dragging === "1");
    if (editing) continue;
    k.number.value = String(v);
    k.range.value = String(toPos(name, v));
  }
}

function knobStatus(text, kind) {
  const el = $("knob-status");
  el.textContent = text;
  el.dataset.kind = kind || "";
}

function sendKnobs(values) {
  const scheduler = {};
  for (const [name, v] of Object.entries(values)) {
    const n = Number(v);
    if (!Number.isInteger(n)) {
      knobStatus(`${name} must be a whole number`, "bad");
      return false;
    }
    scheduler[name] = n;
  }
  if (!sendJson({ type: "session.update", session: { scheduler } })) {
    knobStatus("not connected", "bad");
    return false;
  }
  pendingKnobs = scheduler;
  knobStatus("applying\u2026", "");
  return true;
}

for (const [name, k] of Object.entries(knobs)) {
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
setupKnobRanges();
reflectKnobs({ max_batch_tokens: 256, max_batch_seqs: 32 }, true);

// ---- scheduler panel -----------------------------------------------------------------------------------
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

function onStats(stats) {
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
  if (!pendingKnobs && (cfg.max_batch_tokens !== undefined || cfg.max_batch_seqs !== undefined)) {
    hook.config = Object.assign({}, hook.config || {}, {
      max_batch_tokens: cfg.max_batch_tokens ?? hook.config?.max_batch_tokens,
      max_batch_seqs: cfg.max_batch_seqs ?? hook.config?.max_batch_seqs,
    });
    reflectKnobs(hook.config);
  }
  scheduleDraw();
}

function scheduleDraw() {
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
    ? `${last.decode_tokens} + ${last.prefill_tokens} tok, ${last.seqs ?? "?"} seq`
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
  document.getElementById("v-queues").title = "running/waiting per class";

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

function drawDeadlines() {
  const stats = hook.stats || {};
  const mine = hook.turns.filter((t) => t.deadline_met === true || t.deadline_met === false);
  const recent = mine.map((t) => t.deadline_met);
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

// ---- go ----------------------------------------------------------------------------------------------
setConn("disconnected");
setMic("off");
setPhase("idle");
applySession({}, true);
hook.session = null;
scheduleDraw();
connect();
if (AUTOSTART) startTalking();
