"""Compiled grammars kept by their text, least recently used first out, within a count and a byte budget:
the same schema (a session's tools, an API client's response format) compiles once, and no stream of
distinct schemas can grow the engine's memory without bound."""

from collections import OrderedDict
from typing import Any

Key = tuple[str, str]  # a grammar's (kind, source)


class GrammarCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[Key, tuple[Any, int]] = OrderedDict()  # key -> (compiled, its bytes)
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Any | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: Key, compiled: Any, size: int) -> None:
        """Keep `compiled` (of `size` bytes), evicting the least recently used past either budget; one
        larger than the whole byte budget is not kept."""
        if key in self._entries:
            self.bytes -= self._entries.pop(key)[1]
        if size > self.max_bytes:
            return
        self._entries[key] = (compiled, size)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self.bytes -= self._entries.popitem(last=False)[1][1]
