"""Function calling over any chat model: the tools described in the prompt, the call written in one
documented format, and decoding constrained so that a call is always well formed.

The default model's chat template has no tool format of its own, so a call is written as

    <tool_call>{"name": "NAME", "arguments": {...}}</tool_call>

A grammar (an xgrammar structural tag) holds the model to it: with `tool_choice` "auto" the reply is free
text in which `<tool_call>` starts a call whose name is one of the tools and whose arguments match that
tool's JSON schema; "required" (or a named function) makes the whole reply one such call. The same text
goes back into the prompt when the call is part of the history, so the model sees its own format.
The text API and the Realtime dialect both use this module.
"""

import json
from dataclasses import dataclass, replace
from typing import Any

from scheduler.grammar.constraint import Grammar, bounded
from scheduler.grammar.schema_limits import SchemaTooComplex, check_schema
from voicepipe.ids import new_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 128  # as OpenAI allows


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    field: str = "parameters"  # where the client gave its parameters (what an error about them names)
    server: str = ""  # the label of the MCP server that runs it; "": the client runs it


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A call the model made: its id, the function's name, and its arguments as JSON text."""

    call_id: str
    name: str
    arguments: str
    server: str = ""  # the MCP server that runs it; "": the client


def parse_tools(raw: Any, where: str = "tools", nested: bool = True, servers: bool = False) -> list[Tool]:
    """Function tools from a request; ValueError naming the field at fault. `nested`: the chat API's
    shape (`{"type": "function", "function": {...}}`); else the Realtime API's flat one. `servers`: MCP
    server entries (`{"type": "mcp", ...}`) are passed over, for the caller to read."""
    if not isinstance(raw, list):
        raise ValueError(f"{where}: expected a list of tools")
    if len(raw) > MAX_TOOLS:
        raise SchemaTooComplex(f"{where}: at most {MAX_TOOLS} tools are allowed, not {len(raw)}")
    tools = []
    for n, entry in enumerate(raw):
        at = f"{where}[{n}]"
        if servers and isinstance(entry, dict) and entry.get("type") == "mcp":
            continue
        if not isinstance(entry, dict) or entry.get("type") != "function":
            also = " and 'mcp'" if servers else ""
            raise ValueError(f"{at}.type: only 'function'{also} tools are supported")
        spec = entry.get("function") if nested else entry
        at = f"{at}.function" if nested else at
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ValueError(f"{at}.name: a function needs a name")
        parameters = spec.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ValueError(f"{at}.parameters: expected a JSON schema object")
        try:
            check_schema(parameters)
        except SchemaTooComplex as e:
            raise SchemaTooComplex(f"{at}.parameters: {e}") from None
        tools.append(Tool(spec["name"], str(spec.get("description") or ""), parameters, f"{at}.parameters"))
    if len({t.name for t in tools}) != len(tools):
        raise ValueError(f"{where}: function names must be unique")
    try:  # they compile together: together they are held to one schema's limits
        check_schema([t.parameters for t in tools])
    except SchemaTooComplex as e:
        raise SchemaTooComplex(f"{where}: the tools' parameters together {e}") from None
    return tools


def choose(tools: list[Tool], choice: Any, where: str = "tool_choice") -> str | None:
    """The tool choice as "auto", "required" or a function name; None: no call may be made."""
    if choice is None:
        return "auto" if tools else None
    if choice in ("none", "auto", "required"):
        return None if choice == "none" or not tools else choice
    name = choice.get("name") or (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        raise ValueError(f"{where}: expected 'none', 'auto', 'required' or one of the tools' names")
    return name


def instructions(tools: list[Tool], choice: str) -> str:
    """The system prompt's part that tells the model what it may call, and how."""
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                       for t in tools)
    must = "You must call one of them." if choice == "required" else f"You must call {choice}." \
        if choice != "auto" else "Call one when it helps answer; otherwise answer in words."
    return (f"You can call these functions:\n{listed}\n{must} To call a function, write "
            f'{OPEN}{{"name": <name>, "arguments": <arguments as JSON>}}{CLOSE} and nothing after it.')


def with_instructions(messages: list[dict[str, str]], told: str) -> list[dict[str, str]]:
    """The chat `messages` with `told` (what the model may call) after their system prompt (one is made
    when they have none; nothing changes when `told` is empty)."""
    if not told:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{told}"}, *messages[1:]]
    return [{"role": "system", "content": told}, *messages]


def grammar(tools: list[Tool], choice: str) -> Grammar:
    """The structural tag holding the reply to the call format: free text with at most one call ("auto"),
    or exactly one call of any tool ("required") or of the named one."""
    tags = [{"type": "tag", "begin": _head(t.name), "end": "}" + CLOSE,
             "content": {"type": "json_schema", "json_schema": bounded(t.parameters),
                         "max_whitespace_cnt": 1}}
            for t in tools if choice in ("auto", "required") or t.name == choice]
    if choice == "auto":
        body: dict[str, Any] = {"type": "triggered_tags", "triggers": [OPEN], "tags": tags, "stop_after_first": True}
    else:
        body = {"type": "or", "elements": tags} if len(tags) > 1 else tags[0]
    return Grammar("structural_tag", json.dumps({"type": "structural_tag", "format": body}))


def grammars(tools: list[Tool], choice: str, where: str = "tools") -> list[tuple[str, Grammar]]:
    """What must compile before a reply may call `tools`, each beside the field it comes from: each tool's
    parameters on their own (so a refusal names that tool), then the call format over them (`where`)."""
    return [*((t.field, Grammar("json_schema", json.dumps(bounded(t.parameters)))) for t in tools),
            (where, grammar(tools, choice))]


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (for the history of a conversation that made it)."""
    return f"{_head(name)}{arguments}}}{CLOSE}"


def _head(name: str) -> str:
    return f'{OPEN}{{"name": {json.dumps(name)}, "arguments": '


class FunctionCallParser:
    """Splits a streamed reply into its text and its calls as they arrive: `feed` returns the new text
    and, for each call, ("start", FunctionCall with empty arguments), ("arguments", fragment) and
    ("end", FunctionCall). `servers` names the MCP server that runs each tool it runs."""

    def __init__(self, servers: dict[str, str] | None = None) -> None:
        self.servers = servers or {}
        self._buffer, self._call, self._args = "", None, ""
        self.calls: list[FunctionCall] = []

    def feed(self, text: str) -> list[tuple[str, Any]]:
        self._buffer += text
        events: list[tuple[str, Any]] = []
        while True:
            if self._call is None:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, OPEN)
                    cut = len(self._buffer) - keep
                    if cut:
                        events.append(("text", self._buffer[:cut]))
                    self._buffer = self._buffer[cut:]
                    return events
                if start:
                    events.append(("text", self._buffer[:start]))
                self._buffer = self._buffer[start:]
                marker = self._buffer.find(', "arguments": ')
                if marker < 0:
                    return events
                name = json.loads(self._buffer[len(OPEN):marker].removeprefix('{"name": '))
                self._call, self._args = FunctionCall(new_id("call"), name, "", self.servers.get(name, "")), ""
                self._buffer = self._buffer[marker + len(', "arguments": '):]
                events.append(("start", self._call))
            end = self._buffer.find("}" + CLOSE)
            if end < 0:
                cut = len(self._buffer) - _partial_suffix(self._buffer, "}" + CLOSE)
                events += self._arguments(self._buffer[:cut])
                self._buffer = self._buffer[cut:]
                return events
            events += self._arguments(self._buffer[:end])
            self._buffer = self._buffer[end + len(CLOSE) + 1:]
            events.append(("end", self._finish()))

    def flush(self) -> list[tuple[str, Any]]:
        """The reply ended: what was held back (an unfinished call's arguments end with it)."""
        rest, self._buffer = self._buffer, ""
        if self._call is None:
            return [("text", rest)] if rest else []
        return [*self._arguments(rest), ("end", self._finish())]

    def _arguments(self, fragment: str) -> list[tuple[str, Any]]:
        self._args += fragment
        return [("arguments", fragment)] if fragment else []

    def _finish(self) -> FunctionCall:
        call = replace(self._call, arguments=self._args)
        self.calls.append(call)
        self._call, self._args = None, ""
        return call


def _partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker` (held back until the next piece)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
