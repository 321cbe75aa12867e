// Small pieces of the page that every module uses: element lookup, the error banner and number formats.

import { hook } from "./state.js";

export const $ = (id) => document.getElementById(id);

export function showError(message, code) {
  const text = code ? `${message} (${code})` : message;
  hook.lastError = { message, code: code || null, at: Date.now() };
  hook.errors.push(hook.lastError);
  $("error-text").textContent = text;
  $("error-banner").hidden = false;
}

$("error-close").addEventListener("click", () => {
  $("error-banner").hidden = true;
});

export function fmtS(s) {
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
}

export function fmtRate(hz) {
  return `${(hz / 1000).toFixed(hz % 1000 ? 2 : 0).replace(/\.?0+$/, "")} kHz`;
}
