"""The conversation of one call, as chat messages for the LLM."""

from typing import Any

from voicepipe.stages.base import chat_prompt_ids


class Conversation:
    """The instructions and the user and assistant messages so far.

    Assistant messages are dicts the turn keeps a reference to, so a reply cut short by a barge-in can
    be truncated to what the caller actually heard.
    """

    def __init__(self, instructions: str) -> None:
        self.instructions = instructions
        self.items: list[dict[str, str]] = []

    def add(self, role: str, content: str) -> dict[str, str]:
        item = {"role": role, "content": content}
        self.items.append(item)
        return item

    def truncate(self, item: dict[str, str], heard: str) -> None:
        """An assistant reply was cut off: the conversation keeps only the text the caller heard."""
        item["content"] = heard

    def append(self, item: dict[str, str]) -> None:
        """Add a message built elsewhere (a speculative reply's, once its turn is confirmed)."""
        self.items.append(item)

    def messages(self, pending: tuple[dict[str, str], ...] = ()) -> list[dict[str, str]]:
        said = [item for item in [*self.items, *pending] if item["content"]]
        return [{"role": "system", "content": self.instructions}, *said] if self.instructions else said

    def prompt_ids(self, tokenizer: Any, max_tokens: int, pending: tuple[dict[str, str], ...] = ()) -> list[int]:
        """The chat prompt, with `pending` messages not (yet) in the conversation after the rest, dropping
        the oldest messages while it is longer than max_tokens."""
        ids = chat_prompt_ids(tokenizer, self.messages(pending))
        while len(ids) > max_tokens and len([i for i in self.items if i["content"]]) > 1:
            oldest = next(i for i in self.items if i["content"])
            self.items.remove(oldest)
            ids = chat_prompt_ids(tokenizer, self.messages(pending))
        return ids
