"""Which MCP servers a session may name and how its calls are approved: the operator's servers by label,
other addresses only on the allow-list, OpenAI's `allowed_tools` and `require_approval` shapes, and the
serve flags that configure them."""

import argparse

import pytest

from voicepipe.mcp_servers.spec import McpPolicy, parse_server
from voicepipe.server.settings import SettingsError, load_settings

POLICY = McpPolicy.from_flags(["calendar=http://10.0.0.5:9000/mcp", "files=stdio:python -m files_server"],
                              ["https://tools.example.com/"])


def test_a_session_may_name_an_operator_s_server_by_label_or_an_allowed_url_and_nothing_else():
    calendar = parse_server({"server_label": "calendar"}, "session.tools[0]", POLICY)
    assert calendar.url == "http://10.0.0.5:9000/mcp" and not calendar.needs_approval("book", False)
    files = parse_server({"server_label": "files"}, "session.tools[0]", POLICY)
    assert files.command == ("python", "-m", "files_server")
    own = parse_server({"server_label": "mine", "server_url": "https://tools.example.com/mcp"}, "t", POLICY)
    assert own.url == "https://tools.example.com/mcp" and own.needs_approval("anything", True)  # OpenAI's default
    for entry, field in (({"server_label": "mine", "server_url": "http://169.254.169.254/"}, "t.server_url"),
                         ({"server_label": "nobody"}, "t.server_label"),
                         ({"server_label": "a b"}, "t.server_label"),
                         ({"server_label": "mine", "server_url": "file:///etc/passwd"}, "t.server_url"),
                         ({"server_label": "mine", "server_url": "https://tools.example.com.evil.org/"},
                          "t.server_url"),
                         ({"server_label": "mine", "server_url": "https://tools.example.com:8443/"}, "t.server_url"),
                         ({"server_label": "mine", "server_url": "https://me@tools.example.com/"}, "t.server_url"),
                         ({"server_label": "x", "connector_id": "connector_gmail"}, "t.connector_id")):
        with pytest.raises(ValueError) as refused:
            parse_server(entry, "t", POLICY)
        assert str(refused.value).startswith(field + ":")


def test_allowed_tools_and_approval_filters_pick_tools_by_name_and_read_only_hint():
    spec = parse_server({"server_label": "calendar", "allowed_tools": {"read_only": True},
                         "require_approval": {"never": {"tool_names": ["book"]}}}, "t", POLICY)
    assert spec.allows("list_events", True) and not spec.allows("book", False)
    assert not spec.needs_approval("book", False) and spec.needs_approval("cancel", False)
    spec = parse_server({"server_label": "calendar", "allowed_tools": ["book"], "require_approval": "always"},
                        "t", POLICY)
    assert spec.allows("book", False) and not spec.allows("cancel", False) and spec.needs_approval("book", False)
    spec = parse_server({"server_label": "calendar", "require_approval": {"always": {"read_only": False}}}, "t",
                        POLICY)
    assert spec.needs_approval("book", False) and not spec.needs_approval("list_events", True)
    for bad in ({"require_approval": "sometimes"}, {"allowed_tools": "book"}, {"headers": {"x": 1}},
                {"allowed_tools": {"names": ["book"]}}):
        with pytest.raises(ValueError):
            parse_server({"server_label": "calendar", **bad}, "t", POLICY)


def test_a_session_s_token_becomes_a_header_and_is_never_echoed_back():
    spec = parse_server({"server_label": "calendar", "authorization": "s3cret", "headers": {"X-Team": "a"}},
                        "t", POLICY)
    assert dict(spec.headers) == {"X-Team": "a", "Authorization": "Bearer s3cret"}
    assert "authorization" not in spec.described and "headers" not in spec.described


def test_serve_flags_configure_the_servers_and_a_malformed_one_is_refused_before_anything_loads():
    args = argparse.Namespace(mcp_servers=["calendar=http://10.0.0.5:9000/mcp"],
                              mcp_allow_urls=["https://tools.example.com/"], mcp_timeout=4.0)
    policy = load_settings(args, {}).mcp()
    assert set(policy.servers) == {"calendar"} and policy.call_timeout_s == 4.0
    assert parse_server({"server_label": "own", "server_url": "https://tools.example.com/mcp"}, "t", policy).url
    with pytest.raises(SettingsError, match="LABEL=URL"):
        load_settings(argparse.Namespace(), {"VOICEPIPE_MCP_SERVERS": "no label"})
    with pytest.raises(SettingsError):
        load_settings(argparse.Namespace(), {"VOICEPIPE_MCP_SERVERS": "=http://x"})
