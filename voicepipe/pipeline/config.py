"""What one call may tune: the assistant's instructions, its answers and its deadlines."""

from dataclasses import dataclass, field
from typing import Any

from voicepipe.constrained.tools import Tool
from voicepipe.mcp_servers.spec import ServerSpec
from voicepipe.pipeline.detection import TurnDetection
from voicepipe.pipeline.instructions import DEFAULT_INSTRUCTIONS


@dataclass(slots=True)
class CallConfig:
    instructions: str = DEFAULT_INSTRUCTIONS
    spoken: bool = True  # False: replies in text only (the session's output_modalities ["text"])
    turn_detection: TurnDetection = field(default_factory=TurnDetection)
    # Functions the assistant may call (the client runs them), and `tool_choice` as the client gave it.
    tools: tuple[Tool, ...] = ()
    tool_choice: Any = "auto"
    # MCP servers the session named, and the tools they listed (the server runs these).
    servers: tuple[ServerSpec, ...] = ()
    server_tools: tuple[Tool, ...] = ()
    # Time to first audio, measured from the caller's last voiced frame (the caller's clock, not the server's
    # later confirmation that the turn ended): the deadline each turn is scheduled against.
    ttfa_s: float = 1.5
    max_tokens: int = 96
    temperature: float = 0.0
    # A reply's next sentence is synthesized only once the caller has less than this much of its audio
    # still to hear: a long reply is not synthesized to its end while the caller may yet cut it off, and its
    # sentences do not hold the device ahead of other calls' turns that are due sooner.
    synthesis_horizon_s: float = 4.0
    # What the assistant says while a tool the server runs keeps the caller waiting, in turn (none: silence).
    fillers: tuple[str, ...] = ("One moment, let me check.", "Let me look that up.", "Just a second.")
    # A barge-in cancels the server's calls still running with the reply; False: they run on, and their
    # results are answered in a reply of their own once they land (the caller's own turn answered first).
    interrupt_tool_calls: bool = True
    # Partial transcripts re-transcribe the growing utterance at most this often.
    partial_interval_s: float = 1.0
    # Silence after which the final transcription starts, before the end of speech is confirmed.
    early_final_ms: int = 200
    # Start the reply from that early transcript, holding its audio until the end of speech is confirmed
    # (dropped unheard if the caller goes on speaking).
    speculative: bool = True
    max_utterance_s: float = 30.0
    # The audio front end: cancel the reply's echo from the microphone (off where the client cancels it
    # itself), and suppress noise (None, "near_field" or "far_field", as the Realtime API names it) in what
    # the ASR hears (the VAD judges the audio before it: docs/audio-front-end.md).
    echo_cancellation: bool = True
    noise_reduction: str | None = "near_field"
    # A folder each call's microphone and far end are written to as the front end was given them, when the
    # call ends, to be replayed (`voicepipe bench replay`); None: not kept.
    record_front_end: str | None = None
    # The oldest messages are dropped once the prompt would grow past this, down to `retention_ratio` of it
    # (the session's `truncation`: below 1, the turns after a cut reuse the prefix the KV cache holds).
    max_prompt_tokens: int = 2048
    retention_ratio: float = 1.0

    @property
    def offered(self) -> tuple[Tool, ...]:
        """What a reply may call unless it is given its own tools: the session's functions and the tools its
        MCP servers have listed."""
        return (*self.tools, *self.server_tools)
