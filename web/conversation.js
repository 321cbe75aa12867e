// The conversation: the chat log (the user's words as they are transcribed, the assistant's answers as they
// stream), the phase of the call (hearing, thinking, speaking), reply audio and its barge-in, and each
// finished turn's latency bar. The handlers here take the server's events of a turn.

import { sendIfOpen } from "./connection.js";
import { fitLatencyScale, renderLatency } from "./latency.js";
import { responseCancel } from "./protocol.js";
import { hook, player } from "./state.js";
import { $ } from "./ui.js";

const log = $("log");
const userItems = new Map(); // item_id -> bubble
const replies = new Map(); // response_id -> {el, text, transcript, turn}
let pendingUser = null; // a bubble opened on speech_started, before its item id is known
let currentResponse = null;
let pendingAudio = null; // the response.audio.delta announcing the next binary frame
const droppedResponses = new Set();

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

export function setPhase(phase) {
  hook.phase = phase;
  const el = $("speech-state");
  el.dataset.phase = phase;
  el.textContent = { idle: "", hearing: "hearing you", thinking: "thinking", speaking: "speaking" }[phase];
  $("interrupt").hidden = !(phase === "speaking" || (currentResponse && phase === "thinking") || player.playing);
}

// Stop the reply now: playback is cut here at once, and the server is asked to cancel the response
// (which it ignores when the response has already been fully sent).
export function cancelResponse() {
  if (currentResponse) droppedResponses.add(currentResponse);
  player.clear();
  sendIfOpen(responseCancel());
  setPhase(currentResponse ? "thinking" : "idle");
}
$("interrupt").addEventListener("click", cancelResponse);

// ---- the user's turn -----------------------------------------------------------------------------------
export function speechStarted(ev) {
  if (!(ev.item_id && userItems.has(ev.item_id))) {
    const li = pendingUser || bubble("user");
    li.classList.add("partial");
    li.querySelector(".text").textContent = "\u2026";
    if (ev.item_id) userItems.set(ev.item_id, li);
    else pendingUser = li;
  }
  setPhase("hearing");
}

export function speechStopped() {
  setPhase("thinking");
}

export function transcriptDelta(ev) {
  const li = userBubble(ev.item_id);
  const text = li.querySelector(".text");
  const partial = typeof ev.partial === "string" ? ev.partial : (text.dataset.partial || "") + (ev.delta || "");
  text.dataset.partial = partial;
  li.classList.add("partial");
  stickToBottom(() => {
    text.textContent = partial || "\u2026";
  });
  hook.partials.push(partial);
}

export function transcriptCompleted(ev) {
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
}

// An utterance the server took for the assistant's own voice (or a sound over it) is no turn: its bubble
// goes, and the reply it seemed to interrupt plays on.
export function itemDeleted(ev) {
  const li = userItems.get(ev.item_id);
  if (!li) return;
  li.remove();
  userItems.delete(ev.item_id);
  if (ev.reason) hook.dropped.push({ reason: ev.reason, transcript: ev.transcript || "" });
  if (hook.phase === "thinking") setPhase(player.playing ? "speaking" : currentResponse ? "thinking" : "idle");
}

// ---- the assistant's turn ------------------------------------------------------------------------------
export function responseCreated(ev) {
  const id = ev.response && ev.response.id;
  const li = bubble("assistant");
  li.classList.add("streaming");
  replies.set(id, { el: li, text: "", transcript: hook.transcripts[hook.transcripts.length - 1] || "" });
  currentResponse = id;
  setPhase("thinking");
}

export function textDelta(ev) {
  const r = replies.get(ev.response_id);
  if (!r) return;
  r.text += ev.delta || "";
  stickToBottom(() => {
    r.el.querySelector(".text").textContent = r.text;
  });
}

/** The reply called a tool: shown in its bubble (a call is never spoken). */
export function toolCall(responseId, text) {
  const r = replies.get(responseId);
  if (!r) return;
  r.called = true;
  stickToBottom(() => {
    const line = document.createElement("div");
    line.className = "tool-call";
    line.textContent = text;
    r.el.querySelector(".text").before(line);
  });
}

export function audioDelta(ev) {
  pendingAudio = ev;
}

export function responseDone(ev) {
  const resp = ev.response || {};
  const r = replies.get(resp.id);
  const turn = {
    response_id: resp.id,
    status: resp.status || "completed",
    transcript: r ? r.transcript : "",
    text: r ? r.text : "",
    timings: resp.timings || ev.timings || null,
    waterfall: resp.waterfall || ev.waterfall || null,
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
    if (!r.text && !r.called) r.el.querySelector(".text").textContent = "(no answer)";
    if (fitLatencyScale()) for (const other of replies.values()) if (other.turn) renderLatency(other.turn);
    stickToBottom(() => renderLatency(turn));
  }
  if (currentResponse === resp.id) currentResponse = null;
  if (hook.phase !== "hearing") setPhase(player.playing ? "speaking" : "idle");
}

// ---- reply audio ---------------------------------------------------------------------------------------
/** Barge-in: the server dropped the reply's audio; so does the page, and any of it still on its way. */
// The caller spoke over the reply: drop what is queued. Audio of the same response after this is the rest of
// it, sent because what the caller said was only a backchannel or a noise: it plays.
export function playbackCleared() {
  hook.cleared++;
  pendingAudio = null;
  player.clear();
  if (hook.phase === "speaking") setPhase("idle");
}

/** A binary frame of reply audio (PCM16), described by the response.audio.delta just before it. */
export function onAudio(data) {
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
