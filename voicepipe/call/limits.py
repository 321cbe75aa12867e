"""What one server allows: kept apart from the session so the CLI can show the defaults without loading
the models' libraries."""

from dataclasses import dataclass


@dataclass(slots=True)
class Limits:
    """What one server allows each call (and how many calls at once)."""

    max_calls: int = 4
    max_message_bytes: int = 1 << 20
    max_utterance_s: float = 30.0
    idle_timeout_s: float = 300.0
    # The text API: a request without max_tokens gets this many at most (none may claim the whole context
    # and hold both cores for minutes), and at most this many text requests wait or run at once; more are
    # answered 429. Calls are never refused for text traffic.
    text_max_tokens: int = 512
    max_text_requests: int = 32
    # What one call's conversation may hold between replies (a prompt takes only what fits its context):
    # past either bound the oldest items are dropped, as the prompt would drop them (docs/robustness.md).
    max_conversation_items: int = 1024
    max_conversation_bytes: int = 1 << 20
    # An HTTP request body past this is refused (413) before it is parsed.
    max_body_bytes: int = 1 << 20
