"""The session object of the OpenAI Realtime API (GA, and the beta's older shape), mapped to and from the
native session: what `session.update` may change here, and what `session.created` reports."""

import logging
from typing import Any

from voicepipe.wire_audio import PCMA, PCMU, PHONE_RATE, WireAudio

log = logging.getLogger(__name__)
RATE = 24000  # the Realtime API's PCM rate, both ways
PCM_NAMES = ("audio/pcm", "pcm16")  # GA's format type, and the beta's format string
PCM = WireAudio("pcm16", RATE)
G711_NAMES = {"audio/pcmu": PCMU, "audio/pcma": PCMA, "g711_ulaw": PCMU, "g711_alaw": PCMA}  # GA, beta
VAD_FIELDS = ("type", "threshold", "prefix_padding_ms", "silence_duration_ms", "eagerness", "create_response",
              "interrupt_response", "idle_timeout_ms", "idle_prompts")
INPUT_FIELDS = ("format", "turn_detection", "noise_reduction", "echo_cancellation")  # audio.input's, read here
SEMANTIC_FIELDS = ("type", "eagerness", "create_response", "interrupt_response")  # what its type reads back
OWN_VAD_FIELDS = ("idle_prompts",)  # this server's, taken but not read back: the Realtime types have no such field
# Standard fields this server accepts and ignores (with a warning in its log), rather than failing a client
# that sets them out of habit.
IGNORED = ("model", "voice", "max_output_tokens",
           "max_response_output_tokens", "temperature", "tracing", "include", "prompt",
           "input_audio_transcription", "speed", "client_secret",
           "expires_at", "object", "id")


class UnsupportedSession(ValueError):
    """A session.update asking for something this server cannot do (an audio format it does not code)."""


def native_update(session: Any) -> dict:
    """The native `session.update` body for a GA (or beta) session; warns of fields it ignores."""
    if not isinstance(session, dict):
        return session  # the native session reports the error
    if session.get("type", "realtime") != "realtime":
        raise UnsupportedSession(f"session type {session.get('type')!r} is not supported; use 'realtime'")
    native: dict[str, Any] = {}
    ignored = [name for name in session if name in IGNORED]
    for name in ("instructions", "scheduler", "tools", "tool_choice", "truncation", "interrupt_tool_calls"):
        if name in session:
            native[name] = session[name]
    modalities = session.get("output_modalities", session.get("modalities"))
    if modalities is not None:  # the beta's ["audio", "text"] is spoken, with its transcript
        native["output_modalities"] = ["audio"] if isinstance(modalities, list) and "audio" in modalities \
            else modalities
    audio = session.get("audio") or {}
    inputs, outputs = (audio.get("input") or {}), (audio.get("output") or {})
    if "noise_reduction" in inputs or "input_audio_noise_reduction" in session:
        native["noise_reduction"] = inputs.get("noise_reduction", session.get("input_audio_noise_reduction"))
    if "echo_cancellation" in session or "echo_cancellation" in inputs:  # this server's own: false where the
        native["echo_cancellation"] = session.get("echo_cancellation", inputs.get("echo_cancellation"))  # client
        # cancels echo itself (top level, as it reports it, or in audio.input)
    ignored += [f"audio.input.{k}" for k in inputs if k not in INPUT_FIELDS]
    ignored += [f"audio.output.{k}" for k in outputs if k != "format"]
    detection = inputs["turn_detection"] if "turn_detection" in inputs else session.get("turn_detection")
    if "turn_detection" in inputs or "turn_detection" in session:
        # null: manual turns. An object without a type means server_vad, as the Realtime API reads it.
        native["turn_detection"] = ({"type": "server_vad", **{k: v for k, v in detection.items() if k in VAD_FIELDS}}
                                    if isinstance(detection, dict) else detection)
        if isinstance(detection, dict):
            ignored += [f"turn_detection.{k}" for k in detection if k not in VAD_FIELDS]
    unknown = [k for k in session if k not in (*IGNORED, "type", "instructions", "scheduler", "audio", "tools",
                                               "truncation",
                                               "tool_choice", "input_audio_noise_reduction", "echo_cancellation",
                                               "interrupt_tool_calls",
                                               "output_modalities", "modalities",
                                               "input_audio_format", "output_audio_format", "turn_detection")]
    if ignored or unknown:
        log.warning("session.update: ignored %s", ", ".join(ignored + unknown))
    return native


def audio_formats(session: Any) -> tuple[WireAudio | None, WireAudio | None]:
    """The input and output audio a `session.update` asks for (None: unchanged), GA or beta shaped."""
    if not isinstance(session, dict):
        return None, None
    audio = session.get("audio") or {}
    inputs, outputs = (audio.get("input") or {}), (audio.get("output") or {})
    return (wire_audio(inputs.get("format", session.get("input_audio_format")), "input"),
            wire_audio(outputs.get("format", session.get("output_audio_format")), "output"))


def wire_audio(fmt: Any, which: str) -> WireAudio | None:
    if fmt is None:
        return None
    kind, rate = (fmt, None) if isinstance(fmt, str) else (fmt.get("type"), fmt.get("rate")) \
        if isinstance(fmt, dict) else (None, None)
    if kind in PCM_NAMES and rate in (None, RATE):
        return PCM
    if kind in G711_NAMES and rate in (None, PHONE_RATE):
        return G711_NAMES[kind]
    raise UnsupportedSession(f"{which} audio format {fmt!r} is not supported; this server speaks "
                             f"{{'type': 'audio/pcm', 'rate': {RATE}}}, {{'type': 'audio/pcmu'}} and "
                             "{'type': 'audio/pcma'} (beta: 'pcm16', 'g711_ulaw', 'g711_alaw')")


def format_of(audio: WireAudio, beta: bool) -> dict | str:
    """How a session reads `audio` back: GA's format object or the beta's string."""
    if audio.coding == "pcm16":
        return "pcm16" if beta else {"type": "audio/pcm", "rate": RATE}
    return {"pcmu": "g711_ulaw", "pcma": "g711_alaw"}[audio.coding] if beta else {"type": f"audio/{audio.coding}"}


def ga_session(native: dict, model: str, beta: bool, heard: WireAudio = PCM, said: WireAudio = PCM) -> dict:
    """The session as a Realtime client expects to read it, its audio coded as `heard` (in) and `said` (out)
    (semantic_vad without the threshold and padding the Silero detector under it still uses: the Realtime
    types have no such fields for it)."""
    vad = native["turn_detection"]
    if vad is not None:  # the beta's server_vad has no idle timeout either
        dropped = (*OWN_VAD_FIELDS, *(("idle_timeout_ms",) if beta else ()))
        vad = {k: v for k, v in vad.items() if k not in dropped
               and (vad["type"] != "semantic_vad" or k in SEMANTIC_FIELDS)}
    common = {"id": native["id"], "object": "realtime.session", "model": model,
              "instructions": native["instructions"], "tools": native["tools"], "tool_choice": native["tool_choice"],
              "scheduler": native["scheduler"], "limits": native["limits"],
              "echo_cancellation": native["echo_cancellation"],  # this server's own, beside its scheduler
              "interrupt_tool_calls": native["interrupt_tool_calls"]}
    if beta:
        spoken = native["output_modalities"] == ["audio"]
        return {**common, "modalities": ["audio", "text"] if spoken else ["text"], "voice": "piper",
                "input_audio_format": format_of(heard, True), "output_audio_format": format_of(said, True),
                "turn_detection": vad,
                "input_audio_noise_reduction": native["noise_reduction"]}
    return {**common, "type": "realtime", "output_modalities": native["output_modalities"],
            "audio": {"input": {"format": format_of(heard, False), "turn_detection": vad,
                                "transcription": {"model": "whisper"}, "noise_reduction": native["noise_reduction"]},
                      "output": {"format": format_of(said, False), "voice": "piper", "speed": 1.0}},
            "max_output_tokens": "inf", "tracing": None,
            "truncation": native["truncation"]}
