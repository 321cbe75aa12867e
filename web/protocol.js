// The call protocol as this page speaks it: every event name it sends or reads, and the builders of what
// it sends, in one place. It mirrors the server's voicepipe/protocol/names.py (same names, the part the page
// uses); binary messages are PCM16 audio in both directions and carry no name.

/** Events the page sends (besides binary frames of microphone audio). */
export const ClientEvent = Object.freeze({
  SESSION_UPDATE: "session.update",
  AUDIO_COMMIT: "input_audio_buffer.commit",
  RESPONSE_CREATE: "response.create",
  RESPONSE_CANCEL: "response.cancel",
  ITEM_CREATE: "conversation.item.create",
});

/** Events the page reads (besides the binary frame after each RESPONSE_AUDIO_DELTA). */
export const ServerEvent = Object.freeze({
  SESSION_CREATED: "session.created",
  SESSION_UPDATED: "session.updated",
  SPEECH_STARTED: "input_audio_buffer.speech_started",
  SPEECH_STOPPED: "input_audio_buffer.speech_stopped",
  TRANSCRIPT_DELTA: "conversation.item.input_audio_transcription.delta",
  TRANSCRIPT_COMPLETED: "conversation.item.input_audio_transcription.completed",
  ITEM_DELETED: "conversation.item.deleted",
  RESPONSE_CREATED: "response.created",
  RESPONSE_TEXT_DELTA: "response.text.delta",
  RESPONSE_AUDIO_DELTA: "response.audio.delta",
  RESPONSE_AUDIO_DONE: "response.audio.done",
  RESPONSE_DONE: "response.done",
  CALL_ARGUMENTS_DONE: "response.function_call_arguments.done",
  PLAYBACK_CLEARED: "output_audio_buffer.cleared",
  SCHEDULER_STATS: "scheduler.stats",
  ERROR: "error",
});

/** Error codes the page treats specially. */
export const ErrorCode = Object.freeze({
  IDLE_TIMEOUT: "idle_timeout", // the server closed a call that sat unused
});

/** Change the scheduler's knobs (engine-wide): `scheduler` is {knob name: value}. */
export function sessionUpdate(scheduler) {
  return { type: ClientEvent.SESSION_UPDATE, session: { scheduler } };
}

/** Choose how the server ends the caller's turns: `detection` is a turn_detection object, or null for
 * manual turns (the page commits and asks for the reply). */
export function turnDetectionUpdate(detection) {
  return { type: ClientEvent.SESSION_UPDATE, session: { turn_detection: detection } };
}

/** End the caller's turn by hand (manual turns), and ask for the reply. */
export function commitAndReply() {
  return [{ type: ClientEvent.AUDIO_COMMIT }, { type: ClientEvent.RESPONSE_CREATE }];
}

/** The functions the assistant may call (`tools`, Realtime's flat shape) and how it chooses among them. */
export function toolsUpdate(tools, toolChoice) {
  return { type: ClientEvent.SESSION_UPDATE, session: { tools, tool_choice: toolChoice } };
}

/** A call's result goes into the conversation, and the spoken answer is asked for without more calls. */
export function callOutput(callId, output) {
  return [
    toolsChoice("none"),
    { type: ClientEvent.ITEM_CREATE, item: { type: "function_call_output", call_id: callId, output } },
    { type: ClientEvent.RESPONSE_CREATE },
  ];
}

function toolsChoice(toolChoice) {
  return { type: ClientEvent.SESSION_UPDATE, session: { tool_choice: toolChoice } };
}

/** Ask the server to stop the response in progress. */
export function responseCancel() {
  return { type: ClientEvent.RESPONSE_CANCEL };
}
