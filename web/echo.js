// The server's audio front end as this page uses it. The browser already cancels the echo of the reply
// (getUserMedia's echoCancellation), so the page asks the server to skip its own canceller by default;
// the box turns the server's on after the browser's, and the line beside it shows what it removes.

import { sendJson } from "./connection.js";
import { hook } from "./state.js";
import { $ } from "./ui.js";

const toggle = $("server-echo");
const state = $("echo-state");

/** A session.created: the page's default (the browser's canceller alone) unless the box says otherwise. */
export function created(session) {
  if (session.echo_cancellation !== toggle.checked) sendJson(update(toggle.checked));
}

/** The session as the server reports it: the box follows the call's setting. */
export function fromSession(session) {
  if (!("echo_cancellation" in session)) return;
  toggle.checked = session.echo_cancellation;
  toggle.disabled = false;
  hook.echoCancellation = session.echo_cancellation;
}

/** The call's audio front end, from scheduler.stats: on or off, and the echo it removed. */
export function fromStats(audio) {
  if (!audio) return;
  const erle = audio.echo_return_loss_enhancement_db;
  const which = audio.canceller === "linear" ? " (linear filter: room learnt)" : "";
  state.textContent = audio.echo_cancellation
    ? `server canceller on${which}${erle === null || erle === undefined ? "" : `, ${erle} dB of echo removed`}`
    : "browser canceller only";
  hook.echoState = audio;
}

function update(on) {
  return { type: "session.update", session: { echo_cancellation: on } };
}

toggle.addEventListener("change", () => sendJson(update(toggle.checked)));
