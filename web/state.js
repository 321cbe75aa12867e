// What the modules share: the page's query options, its one AudioContext and reply player, and the test
// hook's data (published as `window.voicepipe` by app.js), which each module keeps up to date for its part.
//
// Query parameters: raw=1 turns off echo cancellation, noise suppression and auto gain (for tests that
// compare signals); autostart=1 opens the microphone at load; ws=URL picks another websocket path of this
// same server (other hosts are ignored: a link must not send your microphone elsewhere); key=KEY passes
// the server's API key to the call.

import { audioContext, INPUT_RATE, Player } from "./audio.js";

const params = new URLSearchParams(location.search);
export const options = Object.freeze({
  raw: params.get("raw") === "1",
  autostart: params.get("autostart") === "1",
  ws: params.get("ws"),
  key: params.get("key"),
});

export const ctx = audioContext();
export const player = new Player(ctx);

// What the page saw, as plain data.
export const hook = {
  state: "disconnected", // websocket: connecting | connected | disconnected
  mic: "off", // off | starting | on
  phase: "idle", // idle | hearing | thinking | speaking
  raw: options.raw,
  contextSampleRate: ctx.sampleRate,
  inputSampleRate: INPUT_RATE,
  outputSampleRate: 22050, // until the session says
  session: null,
  transcripts: [], // final transcripts, in order
  partials: [], // every partial transcript text seen
  dropped: [], // utterances the server took for the assistant's own voice: {reason, transcript}
  answers: [], // the assistant's full answer per finished response
  turns: [], // {response_id, status, transcript, text, timings, waterfall, deadline_met, underruns}
  calls: [], // the calculator's calls: {name, expression, output}
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
};
