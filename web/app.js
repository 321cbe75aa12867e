// The voicepipe call page: microphone up, reply audio down, a chat log with per-turn latency bars, and a
// live view of the mini-O4 scheduler with its two knobs. This module wires the others together: it routes
// the server's events to them, applies the session, and publishes the test hook as `window.voicepipe`.
//
//   protocol.js         every event name the page sends or reads
//   state.js            query options, the AudioContext and player, the test hook's data
//   connection.js       the websocket: its URL, reconnecting, sending and receiving
//   conversation.js     the chat log, transcripts, answers, reply audio and barge-in (latency.js: the bars)
//   knobs.js            the scheduler's knobs, their ranges and values from the server
//   turns.js            the turn-taking mode, and the Reply button of manual turns
//   calculator.js       the built-in tool example: a calculator the assistant calls, run in the page
//   echo.js             the server's echo canceller: off by default here (the browser's runs), a box to turn it on
//   scheduler-panel.js  the live charts of scheduler.stats
//   mic-control.js      the Start talking button and the level meter
//   ui.js               element lookup, the error banner, number formats

import { FRAME_SAMPLES, INPUT_RATE } from "./audio.js";
import { connect, closedForIdle, sendJson, setConn, setReceiver } from "./connection.js";
import * as calculator from "./calculator.js";
import * as echo from "./echo.js";
import * as conversation from "./conversation.js";
import * as knobs from "./knobs.js";
import * as turns from "./turns.js";
import { setMic, startTalking, stopTalking } from "./mic-control.js";
import { ErrorCode, ServerEvent } from "./protocol.js";
import { drawDeadlines, onStats, scheduleDraw } from "./scheduler-panel.js";
import { ctx, hook, options, player } from "./state.js";
import { $, fmtRate, showError } from "./ui.js";

// ---- the server's events, by name ----------------------------------------------------------------------
const handlers = {
  [ServerEvent.SESSION_CREATED]: (ev) => applySession(ev.session || {}, true),
  [ServerEvent.SESSION_UPDATED]: (ev) => applySession(ev.session || {}, false),
  [ServerEvent.SPEECH_STARTED]: conversation.speechStarted,
  [ServerEvent.SPEECH_STOPPED]: conversation.speechStopped,
  [ServerEvent.TRANSCRIPT_DELTA]: conversation.transcriptDelta,
  [ServerEvent.TRANSCRIPT_COMPLETED]: conversation.transcriptCompleted,
  [ServerEvent.ITEM_DELETED]: conversation.itemDeleted,
  [ServerEvent.RESPONSE_CREATED]: conversation.responseCreated,
  [ServerEvent.RESPONSE_TEXT_DELTA]: conversation.textDelta,
  [ServerEvent.RESPONSE_AUDIO_DELTA]: conversation.audioDelta,
  [ServerEvent.RESPONSE_AUDIO_DONE]: () => {},
  [ServerEvent.RESPONSE_DONE](ev) {
    conversation.responseDone(ev);
    calculator.responseDone();
    drawDeadlines();
  },
  [ServerEvent.CALL_ARGUMENTS_DONE]: calculator.callDone,
  [ServerEvent.PLAYBACK_CLEARED]: conversation.playbackCleared,
  [ServerEvent.SCHEDULER_STATS](ev) {
    const stats = ev.stats || {};
    onStats(stats);
    knobs.fromStats(stats.config || {});
    echo.fromStats(stats.audio_input);
  },
  [ServerEvent.ERROR](ev) {
    const e = ev.error || {};
    if (e.code === ErrorCode.IDLE_TIMEOUT && hook.mic !== "on") {
      closedForIdle(); // not a fault: the page sat unused; it reconnects when asked to
      hook.errors.push({ message: e.message, code: e.code, at: Date.now() });
      return;
    }
    showError(e.message || "The server reported an error.", e.code || e.type);
    knobs.refused(e.message);
    turns.refused();
  },
};

function onEvent(ev) {
  const type = ev && ev.type;
  if (typeof type !== "string") return;
  hook.events[type] = (hook.events[type] || 0) + 1;
  const handler = handlers[type];
  if (handler) handler(ev);
}

function applySession(session, created) {
  hook.session = created ? session : Object.assign({}, hook.session || {}, session);
  const s = hook.session;
  const rate = s.output_audio_format && s.output_audio_format.sample_rate;
  if (rate) hook.outputSampleRate = rate;
  knobs.fromSession(s, created);
  turns.fromSession(s);
  calculator.fromSession(s);
  if (created) echo.created(s);
  echo.fromSession(s);
  showSession(s);
}

function showSession(s) {
  $("session-info").textContent = s.id ? `session ${String(s.id).slice(0, 12)}` : "";
  $("rates").textContent = `mic ${fmtRate(ctx.sampleRate)} \u2192 ${fmtRate(INPUT_RATE)} PCM16, `
    + `${FRAME_SAMPLES / (INPUT_RATE / 1000)} ms frames \u00b7 reply ${fmtRate(hook.outputSampleRate)} PCM16`;
}

setReceiver({ onEvent, onAudio: conversation.onAudio, onClosed: () => player.clear() });

// ---- the test hook: what the page saw, as plain data, and the page's controls --------------------------
Object.assign(hook, {
  start: () => startTalking(),
  stop: () => stopTalking(),
  cancel: () => conversation.cancelResponse(),
  setKnobs: (values) => knobs.sendKnobs(values),
  send: (obj) => sendJson(obj),
  // Hand the page a message as if the server had sent it: an event object or a PCM16 ArrayBuffer.
  receive(msg) {
    if (msg instanceof ArrayBuffer) conversation.onAudio(msg);
    else onEvent(typeof msg === "string" ? JSON.parse(msg) : msg);
  },
});
Object.defineProperties(hook, {
  audioBufferedSeconds: { enumerable: true, get: () => player.buffered },
  playing: { enumerable: true, get: () => player.playing },
  contextState: { enumerable: true, get: () => ctx.state },
});
window.voicepipe = hook;

// ---- go ------------------------------------------------------------------------------------------------
setConn("disconnected");
setMic("off");
conversation.setPhase("idle");
showSession({});
scheduleDraw();
connect();
if (options.autostart) startTalking();
