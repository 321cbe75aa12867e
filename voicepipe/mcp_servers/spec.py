"""Which MCP servers a call may use, and how: the operator configures servers by label (streamable HTTP or a
command spoken to over stdio) and the addresses a session may name itself; a session's `mcp` tool (OpenAI's
shape) names one of the operator's servers by its label, or an allowed address by `server_url`. A session
never makes the server call an address the operator did not allow."""

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_HEADERS = 16


@dataclass(frozen=True, slots=True)
class ToolFilter:
    """Tools picked by name and/or by their read-only annotation (OpenAI's `tool_names`, `read_only`);
    an empty filter picks none."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def picks(self, name: str, read_only: bool) -> bool:
        if self.names is None and self.read_only is None:
            return False
        return (self.names is None or name in self.names) and (self.read_only is None or self.read_only == read_only)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One MCP server as a call uses it. `allowed`: the tools the model may call (None: all it lists);
    which calls wait for the client's approval: those `always` picks (None: every one) and `never` does not."""

    label: str
    url: str | None = None  # streamable HTTP
    command: tuple[str, ...] = ()  # stdio: a command and its arguments, started for the call
    headers: tuple[tuple[str, str], ...] = ()
    local: Any = None  # an MCP server in this process (the phone's keypad), connected in memory
    allowed: ToolFilter | None = None
    always: ToolFilter | None = None
    never: ToolFilter = ToolFilter()
    described: dict[str, Any] = field(default_factory=dict, compare=False)  # the tool entry as the session gave it

    def allows(self, name: str, read_only: bool) -> bool:
        return self.allowed is None or self.allowed.picks(name, read_only)

    def needs_approval(self, name: str, read_only: bool) -> bool:
        if self.never.picks(name, read_only):
            return False
        return self.always is None or self.always.picks(name, read_only)


@dataclass(frozen=True, slots=True)
class McpPolicy:
    """The operator's word on MCP: servers by label, the URL prefixes a session may name, and how long a
    server may take to list its tools and to run one."""

    servers: dict[str, ServerSpec] = field(default_factory=dict)
    allowed_urls: tuple[str, ...] = ()
    list_timeout_s: float = 5.0
    call_timeout_s: float = 10.0
    # Each tool's learnt time (seconds, by server and tool), shared by every call: a slow tool's first call
    # in a new call is kept company at once.
    times: dict[str, float] = field(default_factory=dict, compare=False)

    @classmethod
    def from_flags(cls, servers: list[str], allowed_urls: list[str], call_timeout_s: float = 10.0) -> "McpPolicy":
        """From `LABEL=URL` or `LABEL=stdio:COMMAND ARGS` (the operator's servers need no approval)."""
        found = {}
        for flag in servers:
            label, _, target = flag.partition("=")
            if not LABEL.fullmatch(label) or not target:
                raise ValueError(f"--mcp-server {flag!r}: expected LABEL=URL or LABEL=stdio:COMMAND")
            if target.startswith("stdio:"):
                spec = ServerSpec(label, command=tuple(shlex.split(target.removeprefix("stdio:"))), always=ToolFilter())
            else:
                spec = ServerSpec(label, url=target, always=ToolFilter())
            found[label] = spec
        return cls(found, tuple(allowed_urls), call_timeout_s=call_timeout_s)

    def describe(self) -> dict:
        return {"servers": sorted(self.servers), "allowed_urls": list(self.allowed_urls)}


def parse_server(entry: dict, at: str, policy: McpPolicy) -> ServerSpec:
    """A session's `{"type": "mcp", ...}` tool as a server it may use; ValueError naming the field at fault."""
    label = entry.get("server_label")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise ValueError(f"{at}.server_label: a label of 1-64 letters, digits, '_' or '-' is required")
    if entry.get("connector_id") is not None:
        raise ValueError(f"{at}.connector_id: connectors are not supported; name an MCP server")
    url = entry.get("server_url")
    if url is None:
        spec = policy.servers.get(label)
        if spec is None:
            raise ValueError(f"{at}.server_label: the server has no MCP server {label!r} configured; give a "
                             "server_url on its allow-list")
    elif not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{at}.server_url: an http(s) URL is required")
    elif not any(_under(url, prefix) for prefix in policy.allowed_urls):
        raise ValueError(f"{at}.server_url: {url!r} is not on the server's allow-list of MCP servers")
    else:
        spec = ServerSpec(label, url=url)
    headers = _headers(entry, at)
    allowed = _filter(entry["allowed_tools"], f"{at}.allowed_tools") if entry.get("allowed_tools") is not None \
        else spec.allowed
    always, never = _approval(entry.get("require_approval"), f"{at}.require_approval", spec)
    return replace(spec, headers=spec.headers + headers, allowed=allowed, always=always, never=never,
                   described={k: v for k, v in entry.items() if k not in ("headers", "authorization")})


def _under(url: str, prefix: str) -> bool:
    """Whether `url` is at the allowed `prefix`: the same scheme, host and port, and a path under its path
    (so `https://tools.example.com` does not allow `https://tools.example.com.evil.org`)."""
    try:
        given, allowed = urlsplit(url), urlsplit(prefix)
        same = (given.scheme, given.hostname, given.port) == (allowed.scheme, allowed.hostname, allowed.port)
    except ValueError:  # a port that is not a number
        return False
    path = allowed.path.rstrip("/")
    return same and given.username is None and (given.path == path or given.path.startswith(path + "/"))


def _headers(entry: dict, at: str) -> tuple[tuple[str, str], ...]:
    headers = entry.get("headers") or {}
    if not (isinstance(headers, dict) and len(headers) <= MAX_HEADERS
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
        raise ValueError(f"{at}.headers: at most {MAX_HEADERS} string headers")
    token = entry.get("authorization")
    if token is not None:
        if not isinstance(token, str):
            raise ValueError(f"{at}.authorization: a token string")
        headers = {**headers, "Authorization": f"Bearer {token}"}
    return tuple(headers.items())


def _filter(raw: Any, at: str) -> ToolFilter:
    if isinstance(raw, list) and all(isinstance(n, str) for n in raw):
        return ToolFilter(frozenset(raw))
    if isinstance(raw, dict) and set(raw) <= {"tool_names", "read_only"}:
        names, read_only = raw.get("tool_names"), raw.get("read_only")
        if (names is None or isinstance(names, list) and all(isinstance(n, str) for n in names)) \
                and (read_only is None or isinstance(read_only, bool)):
            return ToolFilter(None if names is None else frozenset(names), read_only)
    raise ValueError(f"{at}: a list of tool names, or {{'tool_names': [...], 'read_only': true|false}}")


def _approval(raw: Any, at: str, spec: ServerSpec) -> tuple[ToolFilter | None, ToolFilter]:
    """(always, never) from `require_approval`: "always", "never", {"always": filter, "never": filter} (a
    tool neither picks needs approval); not given: the configured server's, or always (as OpenAI has it)."""
    if raw is None:
        return spec.always, spec.never
    if raw == "always":
        return None, ToolFilter()
    if raw == "never":
        return ToolFilter(), ToolFilter()
    if isinstance(raw, dict) and set(raw) <= {"always", "never"}:
        always = _filter(raw["always"], f"{at}.always") if raw.get("always") is not None else None
        never = _filter(raw["never"], f"{at}.never") if raw.get("never") is not None else ToolFilter()
        return always, never
    raise ValueError(f"{at}: 'always', 'never', or {{'always': filter, 'never': filter}}")
