"""Every event name a client sends or reads, in one place; `web/protocol.js` mirrors it for the page.
Names follow the OpenAI Realtime API wherever it has a counterpart."""


class ClientEvent:
    """What a client may send (besides binary frames of PCM16 audio)."""

    AUDIO_APPEND = "input_audio_buffer.append"
    AUDIO_COMMIT = "input_audio_buffer.commit"
    AUDIO_CLEAR = "input_audio_buffer.clear"
    SESSION_UPDATE = "session.update"
    ITEM_CREATE = "conversation.item.create"
    KEY_PRESSED = "input_audio_buffer.dtmf"  # voicepipe's: what a telephony line reports of its keypad
    ITEM_TRUNCATE = "conversation.item.truncate"
    ITEM_DELETE = "conversation.item.delete"
    ITEM_RETRIEVE = "conversation.item.retrieve"
    RESPONSE_CREATE = "response.create"
    RESPONSE_CANCEL = "response.cancel"


class ServerEvent:
    """What the server sends (besides a binary frame after each `RESPONSE_AUDIO_DELTA`)."""

    SESSION_CREATED = "session.created"
    SESSION_UPDATED = "session.updated"
    SPEECH_STARTED = "input_audio_buffer.speech_started"
    SPEECH_STOPPED = "input_audio_buffer.speech_stopped"
    AUDIO_COMMITTED = "input_audio_buffer.committed"
    AUDIO_CLEARED = "input_audio_buffer.cleared"
    AUDIO_TIMEOUT = "input_audio_buffer.timeout_triggered"
    KEY_RECEIVED = "input_audio_buffer.dtmf_event_received"
    TRANSCRIPT_DELTA = "conversation.item.input_audio_transcription.delta"
    TRANSCRIPT_COMPLETED = "conversation.item.input_audio_transcription.completed"
    ITEM_ADDED = "conversation.item.added"
    ITEM_DONE = "conversation.item.done"
    ITEM_TRUNCATED = "conversation.item.truncated"
    ITEM_DELETED = "conversation.item.deleted"
    ITEM_RETRIEVED = "conversation.item.retrieved"
    RESPONSE_CREATED = "response.created"
    RESPONSE_TEXT_DELTA = "response.text.delta"
    RESPONSE_AUDIO_DELTA = "response.audio.delta"
    RESPONSE_AUDIO_DONE = "response.audio.done"
    RESPONSE_DONE = "response.done"
    CALL_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
    CALL_ARGUMENTS_DONE = "response.function_call_arguments.done"
    # Tools the server runs on an MCP server: its listing when a session names it, and each call.
    MCP_LIST_IN_PROGRESS = "mcp_list_tools.in_progress"
    MCP_LIST_COMPLETED = "mcp_list_tools.completed"
    MCP_LIST_FAILED = "mcp_list_tools.failed"
    MCP_ARGUMENTS_DELTA = "response.mcp_call_arguments.delta"
    MCP_ARGUMENTS_DONE = "response.mcp_call_arguments.done"
    MCP_CALL_IN_PROGRESS = "response.mcp_call.in_progress"
    MCP_CALL_COMPLETED = "response.mcp_call.completed"
    MCP_CALL_FAILED = "response.mcp_call.failed"
    PLAYBACK_CLEARED = "output_audio_buffer.cleared"
    SCHEDULER_STATS = "scheduler.stats"
    ERROR = "error"
