// The call's websocket: which URL it opens, (re)connecting with backoff, sending events and microphone
// frames, and handing what arrives to the page (events as objects, audio as ArrayBuffers).

import { hook, options } from "./state.js";
import { $, showError } from "./ui.js";

/** This page's own server's websocket; `asked` may pick another path on the same host, never another host. */
export function callUrl(asked, key) {
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

const WS_URL = callUrl(options.ws, options.key);
const MAX_BUFFERED = 1 << 20; // microphone frames are dropped while this much is still unsent

let ws = null;
let backoff = 500;
let reconnectTimer = null;
let openWaiters = [];
let idleClosed = false; // the server closed an idle call: wait for the user before calling again
let receiver = { onEvent() {}, onAudio() {}, onClosed() {} };

/** Where incoming messages go: onEvent(event), onAudio(arrayBuffer), onClosed() when the call drops. */
export function setReceiver(r) {
  receiver = r;
}

export function setConn(state, detail) {
  hook.state = state;
  $("conn").dataset.state = state;
  $("conn-text").textContent = detail || state;
}

export function connect() {
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
    if (typeof e.data !== "string") {
      receiver.onAudio(e.data);
      return;
    }
    let ev;
    try {
      ev = JSON.parse(e.data);
    } catch {
      showError("The server sent a message that is not JSON.");
      return;
    }
    receiver.onEvent(ev);
  };
  sock.onclose = (e) => {
    if (ws !== sock) return;
    ws = null;
    openWaiters.forEach((f) => f(false));
    openWaiters = [];
    receiver.onClosed();
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

/** The server closed the call for sitting idle: when it goes, wait for a click instead of reconnecting. */
export function closedForIdle() {
  idleClosed = true;
}

function isOpen() {
  return ws !== null && ws.readyState === WebSocket.OPEN;
}

/** Resolves true once connected (connecting if need be), false if that fails or takes too long. */
export function whenConnected(timeoutMs = 10000) {
  if (isOpen()) return Promise.resolve(true);
  if (!ws) connect();
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), timeoutMs);
    openWaiters.push((ok) => {
      clearTimeout(t);
      resolve(ok);
    });
  });
}

/** Send an event; when not connected, say so in the error banner and return false. */
export function sendJson(obj) {
  if (!isOpen()) {
    showError("Not connected to the server.");
    return false;
  }
  ws.send(JSON.stringify(obj));
  return true;
}

/** Send an event if connected; otherwise drop it quietly. */
export function sendIfOpen(obj) {
  if (!isOpen()) return false;
  ws.send(JSON.stringify(obj));
  return true;
}

/** Send a microphone frame unless the connection is down or backed up; true if it went. */
export function sendAudio(pcm) {
  if (!isOpen() || ws.bufferedAmount >= MAX_BUFFERED) return false;
  ws.send(pcm);
  return true;
}
