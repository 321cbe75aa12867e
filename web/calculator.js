// The built-in tool example: a calculator the assistant calls, run here in the page. Switched on, the
// session gets the `calculator` function with tool_choice "required" (the small default model seldom
// chooses a tool by itself), so each question is first a call: the page evaluates the expression, sends
// the result as a function_call_output item, and asks for the spoken answer with tool_choice "none";
// once that answer is done, the next question is a call again.

import { sendJson } from "./connection.js";
import { callOutput, toolsUpdate } from "./protocol.js";
import { hook } from "./state.js";
import { $ } from "./ui.js";
import { toolCall } from "./conversation.js";

const NUMBER = "-?[0-9]{1,9}([.][0-9]{1,6})?";
export const CALCULATOR = Object.freeze({
  type: "function",
  name: "calculator",
  description: "Evaluate an arithmetic expression of numbers and + - * /, e.g. 37 * 43.",
  parameters: {
    type: "object",
    // Numbers joined by operators: the grammar lets the model write nothing else.
    properties: { expression: { type: "string", pattern: `^${NUMBER}( ?[-+*/] ?${NUMBER}){1,4}$` } },
    required: ["expression"],
    additionalProperties: false,
  },
});

const toggle = $("calculator");
let result = null; // the call of the response in progress, evaluated: {call_id, output}
let answering = false; // the spoken answer after a call is in progress

/** The value of an arithmetic expression (numbers, + - * /, parentheses), or an error message. */
export function evaluate(expression) {
  const tokens = String(expression).match(/\d+(?:\.\d+)?|[-+*/()]|\S/g) || [];
  let at = 0;
  const peek = () => tokens[at];
  const take = () => tokens[at++];
  function factor() {
    const t = take();
    if (t === "-") return -factor();
    if (t === "(") {
      const v = sum();
      if (take() !== ")") throw new Error("a parenthesis is not closed");
      return v;
    }
    if (t !== undefined && /^\d/.test(t)) return Number(t);
    throw new Error(`unexpected ${t === undefined ? "end" : `'${t}'`}`);
  }
  function product() {
    let v = factor();
    while (peek() === "*" || peek() === "/") v = take() === "*" ? v * factor() : v / factor();
    return v;
  }
  function sum() {
    let v = product();
    while (peek() === "+" || peek() === "-") v = take() === "+" ? v + product() : v - product();
    return v;
  }
  try {
    const v = sum();
    if (at < tokens.length) throw new Error(`unexpected '${peek()}'`);
    return Number.isFinite(v) ? String(Math.round(v * 1e9) / 1e9) : "not a finite number";
  } catch (e) {
    return `error: ${e.message}`;
  }
}

/** The session as the server reports it: the box shows whether the calculator is among its tools. */
export function fromSession(session) {
  if (!("tools" in session)) return;
  toggle.checked = (session.tools || []).some((t) => t.name === CALCULATOR.name);
  toggle.disabled = false;
}

/** A call is complete: evaluate it now; its output goes back once its response is done. */
export function callDone(ev) {
  if (ev.name !== CALCULATOR.name) return;
  let expression = "";
  try {
    expression = JSON.parse(ev.arguments).expression;
  } catch {
    expression = "";
  }
  const output = evaluate(expression);
  result = { call_id: ev.call_id, output };
  hook.calls.push({ name: ev.name, expression, output });
  toolCall(ev.response_id, `calculator(${expression}) = ${output}`);
}

/** A response ended: after a call, send its output and ask for the answer; after the answer, calls again. */
export function responseDone() {
  if (result) {
    for (const message of callOutput(result.call_id, result.output)) sendJson(message);
    result = null;
    answering = true;
  } else if (answering) {
    answering = false;
    if (toggle.checked) sendJson(toolsUpdate([CALCULATOR], "required"));
  }
}

toggle.addEventListener("change", () => {
  result = null;
  answering = false;
  sendJson(toggle.checked ? toolsUpdate([CALCULATOR], "required") : toolsUpdate([], "auto"));
});
