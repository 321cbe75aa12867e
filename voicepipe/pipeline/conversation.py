"""The conversation of one call, as chat messages for the LLM."""

from typing import Any

from voicepipe import tools
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.ids import new_id


class Conversation:
    """The instructions and the user and assistant messages so far, each under its item id.

    Stages change a message only through these methods, by id: a reply's text when it is written, and
    its truncation to what the caller heard when it is cut off.
    """

    def __init__(self, instructions: str) -> None:
        self.instructions = instructions
        self.tool_instructions = ""  # what the model may call, and how: after the instructions, every prompt
        self.items: list[dict[str, Any]] = []  # {"id", "role", "content", "spoken"[, "truncated"]}, oldest first

    def add(self, role: str, content: str, item_id: str | None = None, spoken: bool = False) -> str:
        """A message; `spoken` if it was said aloud (the caller's speech, a spoken reply), as a client
        reading the item back sees it: audio with its transcript."""
        item_id = item_id or new_id("item")
        self.items.append({"id": item_id, "role": role, "content": content, "spoken": spoken})
        return item_id

    def get(self, item_id: str) -> dict[str, Any] | None:
        return next((item for item in self.items if item["id"] == item_id), None)

    def delete(self, item_id: str) -> dict[str, Any] | None:
        """Take an item out: no later prompt holds it (the KV cache keeps only what still matches)."""
        item = self.get(item_id)
        if item is not None:
            self.items.remove(item)
        return item

    def set_reply(self, item_id: str, text: str) -> None:
        """The reply's text as written, once the LLM is done (nothing, if the item was dropped or cut off
        meanwhile)."""
        item = self.get(item_id)
        if item is not None and not item.get("truncated"):
            item["content"] = text

    def truncate(self, item_id: str, heard: str) -> None:
        """A reply was cut off: the conversation keeps only the text the caller heard, for good."""
        item = self.get(item_id)
        if item is not None:
            item["content"], item["truncated"] = heard, True

    def messages(self, pending: tuple[dict[str, str], ...] = (), instructions: str | None = None
                 ) -> list[dict[str, str]]:
        said = [{"role": i["role"], "content": i["content"]} for i in [*self.items, *pending] if i["content"]]
        instructions = self.instructions if instructions is None else instructions
        system = [{"role": "system", "content": instructions}] if instructions else []
        return [*tools.with_instructions(system, self.tool_instructions), *said]

    def prompt_ids(self, tokenizer: Any, max_tokens: int, pending: tuple[dict[str, str], ...] = (),
                   instructions: str | None = None) -> list[int]:
        """The chat prompt, with `pending` messages not (yet) in the conversation after the rest (and other
        `instructions`, for one reply), dropping the oldest messages while it is longer than max_tokens."""
        ids = chat_prompt_ids(tokenizer, self.messages(pending, instructions))
        while len(ids) > max_tokens and len([i for i in self.items if i["content"]]) > 1:
            oldest = next(i for i in self.items if i["content"])
            self.items.remove(oldest)
            ids = chat_prompt_ids(tokenizer, self.messages(pending, instructions))
        return ids
