// The turn-taking mode: how the server decides the caller has finished. The select sends a session.update
// of turn_detection and shows what the server reports back (session.created / session.updated); under
// manual turns the Reply button ends the turn and asks for the answer.

import { sendJson } from "./connection.js";
import { commitAndReply, turnDetectionUpdate } from "./protocol.js";
import { hook } from "./state.js";
import { $ } from "./ui.js";

const select = $("turn-mode");
const reply = $("reply");

/** The select's value for a session's turn_detection (null: manual). */
function modeOf(detection) {
  if (!detection) return "manual";
  if (detection.type === "semantic_vad") return `semantic_vad:${detection.eagerness || "auto"}`;
  return "server_vad";
}

/** The turn_detection a select value asks for. */
function detectionOf(mode) {
  if (mode === "manual") return null;
  const [type, eagerness] = mode.split(":");
  return type === "semantic_vad" ? { type, eagerness } : { type, silence_duration_ms: 500 };
}

/** A session.created or session.updated: show the mode the server is in. */
export function fromSession(session) {
  if (!("turn_detection" in session)) return;
  const mode = modeOf(session.turn_detection);
  hook.turnMode = mode;
  select.value = mode;
  select.disabled = false;
  reply.hidden = mode !== "manual";
}

/** The server refused a change: show its mode again. */
export function refused() {
  if (hook.turnMode) select.value = hook.turnMode;
}

select.addEventListener("change", () => {
  if (!sendJson(turnDetectionUpdate(detectionOf(select.value)))) refused();
});

reply.addEventListener("click", () => {
  for (const message of commitAndReply()) sendJson(message);
});
