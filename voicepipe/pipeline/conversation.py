"""The conversation of one call, as chat messages for the LLM.

Built for a client that piles up items: each message is measured in tokens once, when it is added or
changed, so the next prompt is chosen by adding up counts (the oldest dropped in one pass) and rendered
through the chat template once, over only what fits. Items are kept by id in insertion order (an
OrderedDict), so a lookup, a delete or dropping the oldest is constant-time however long the call.
"""

from collections import OrderedDict
from typing import Any

from voicepipe.backends.base import chat_prompt_ids
from voicepipe.constrained import tools
from voicepipe.ids import new_id
from voicepipe.pipeline.turn import Reply

# What a message is measured beside: its count is what it adds to a chat that holds only this (templates
# that add a default system prompt to a chat without one would otherwise count it into every message).
ANCHOR = {"role": "system", "content": "."}


CUT = "…"  # what a reply cut off ends with, in the conversation


class Conversation:
    """The instructions and the user and assistant messages so far, each under its item id.

    Stages change a message only through these methods, by id: a reply's text when it is written, and
    its truncation to what the caller heard when it is cut off. At most `max_items` items and
    `max_bytes` bytes of text are held: past either, the oldest items go, as they would from the prompt.
    """

    def __init__(self, instructions: str, tokenizer: Any, max_items: int = 1024, max_bytes: int = 1 << 20) -> None:
        self.instructions = instructions
        self.tool_instructions = ""  # what the model may call, and how: after the instructions, every prompt
        # When the prompt outgrows its budget, the oldest messages go until it is this share of the budget:
        # below 1, the next turns add to a prefix the KV cache still holds, instead of each cutting anew.
        self.retention = 1.0
        self.tokenizer, self.max_items, self.max_bytes = tokenizer, max_items, max_bytes
        # id -> {"id", "role", "content", "spoken"[, "truncated"]}, oldest first; "tokens" and "bytes" are
        # the content's own measures, kept beside it.
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._bytes = 0
        self._anchor_tokens: int | None = None

    @property
    def items(self) -> list[dict[str, Any]]:
        """The items, oldest first (a new list: for reading)."""
        return list(self._items.values())

    def add(self, role: str, content: str, item_id: str | None = None, spoken: bool = False) -> str:
        """A message; `spoken` if it was said aloud (the caller's speech, a spoken reply), as a client
        reading the item back sees it: audio with its transcript. An item with the id of one already held
        replaces it, at the end."""
        item_id = item_id or new_id("item")
        self.delete(item_id)
        item = {"id": item_id, "role": role, "content": "", "spoken": spoken, "tokens": 0, "bytes": 0}
        self._items[item_id] = item
        self._set_content(item, content)
        while len(self._items) > self.max_items or (self._bytes > self.max_bytes and len(self._items) > 1):
            self._drop_through(next(iter(self._items)))
        return item_id

    def get(self, item_id: str) -> dict[str, Any] | None:
        return self._items.get(item_id)

    def prompt_of(self, messages: list[dict[str, str]], instructions: str | None = None,
                  tool_instructions: str | None = None) -> list[int]:
        """The chat prompt of the session's instructions and `messages` alone (a reply given its own input)."""
        return chat_prompt_ids(self.tokenizer, [*self._system(instructions, tool_instructions), *messages])

    def delete(self, item_id: str) -> dict[str, Any] | None:
        """Take an item out: no later prompt holds it (the KV cache keeps only what still matches)."""
        item = self._items.pop(item_id, None)
        if item is not None:
            self._bytes -= item["bytes"]
        return item

    def add_reply(self, item_id: str, reply: Reply, spoken: bool) -> None:
        """A reply written so far, with its complete function calls (one still being written joins when
        it is), as a reply begun ahead of the caller joins once their words are confirmed."""
        self.add("assistant", reply.text, item_id, spoken=spoken)
        for call_item, call in reply.calls:
            if call.arguments:
                self.add("assistant", tools.call_text(call.name, call.arguments), call_item)

    def set_reply(self, item_id: str, text: str) -> None:
        """The reply's text as written, once the LLM is done (nothing, if the item was dropped or cut off
        meanwhile)."""
        item = self.get(item_id)
        if item is not None and not item.get("truncated"):
            self._set_content(item, text)

    def truncate(self, item_id: str, heard: str) -> None:
        """A reply was cut off: the conversation keeps only the text the caller heard, for good, marked where
        it was cut (CUT) when words were lost, so the client reading it back and the model both see it."""
        item = self.get(item_id)
        if item is not None:
            cut = heard and heard != item["content"].strip() and not item.get("truncated")
            self._set_content(item, heard + CUT if cut else heard)
            item["truncated"] = True

    def messages(self, pending: tuple[dict[str, str], ...] = (), instructions: str | None = None,
                 tool_instructions: str | None = None) -> list[dict[str, str]]:
        said = [{"role": i["role"], "content": i["content"]} for i in [*self._items.values(), *pending]
                if i["content"]]
        return [*self._system(instructions, tool_instructions), *said]

    def prompt_ids(self, max_tokens: int, pending: tuple[dict[str, str], ...] = (),
                   instructions: str | None = None, tool_instructions: str | None = None) -> list[int]:
        """The chat prompt, with `pending` messages not (yet) in the conversation after the rest (and other
        `instructions` or tools, for one reply), dropping the oldest messages while it is longer than
        max_tokens (down to `retention` of it, once any must go).

        The messages that fit are found from their counts, newest first; the template is rendered once
        over them (and again only if the counts fell short of the rendered length, dropping by counts)."""
        said = [item for item in self._items.values() if item["content"]]
        frame = chat_prompt_ids(self.tokenizer, [*self._system(instructions, tool_instructions), *pending])
        budget = max_tokens
        if len(frame) + sum(item["tokens"] for item in said) > max_tokens:
            budget = int(max_tokens * self.retention)
        room, first = budget - len(frame), len(said)
        while first > 0 and (first == len(said) or room >= said[first - 1]["tokens"]):
            first -= 1
            room -= said[first]["tokens"]
        while True:
            self._drop_through(said[first - 1]["id"] if first else None)
            ids = chat_prompt_ids(self.tokenizer, self.messages(pending, instructions, tool_instructions))
            if len(ids) <= max_tokens or first >= len(said) - 1:
                return ids
            over = len(ids) - max_tokens
            while over > 0 and first < len(said) - 1:
                over -= said[first]["tokens"]
                first += 1

    # -- inside --------------------------------------------------------------------------------------------
    def _system(self, instructions: str | None, tool_instructions: str | None = None) -> list[dict[str, str]]:
        instructions = self.instructions if instructions is None else instructions
        system = [{"role": "system", "content": instructions}] if instructions else []
        return tools.with_instructions(system, self.tool_instructions if tool_instructions is None
                                       else tool_instructions)

    def _set_content(self, item: dict[str, Any], content: str) -> None:
        size = len(content.encode(errors="replace"))
        self._bytes += size - item["bytes"]
        item.update(content=content, bytes=size, tokens=self._tokens(item["role"], content))

    def _tokens(self, role: str, content: str) -> int:
        """What a message adds to a prompt, in tokens: measured once, over this message alone."""
        if not content:
            return 0
        if self._anchor_tokens is None:
            self._anchor_tokens = len(chat_prompt_ids(self.tokenizer, [ANCHOR]))
        return len(chat_prompt_ids(self.tokenizer, [ANCHOR, {"role": role, "content": content}])) - self._anchor_tokens

    def _drop_through(self, item_id: str | None) -> None:
        """The oldest items leave the conversation, up to and with `item_id`."""
        while item_id is not None and self._items:
            oldest, item = self._items.popitem(last=False)
            self._bytes -= item["bytes"]
            if oldest == item_id:
                return
