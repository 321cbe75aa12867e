"""HTTP as a conformance checker speaks it: every route answers a method it does not take with 405 and an
`Allow` header, OPTIONS with what it takes, HEAD as GET without the body; bodies too deep or too large
for the parser get OpenAI-shaped errors; values OpenAI's schema allows (null for an optional field) are
accepted. A real server over the fake engine: milliseconds.

(schemathesis would generate these cases from OpenAI's OpenAPI description, but that description cannot
be fetched where the tests run, so the cases it reported are written out here.)"""

import asyncio
import json

import pytest
import pytest_asyncio
from support.fake_call import fake_server

from voicepipe.call.limits import Limits

pytestmark = pytest.mark.asyncio(loop_scope="module")
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "Hello?"}]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with fake_server(Limits(max_body_bytes=64 * 1024)) as (server, _):
        yield server


async def request(server, method: str, path: str, body: bytes = b"",
                  headers: str = "") -> tuple[int, dict[str, str], bytes]:
    """A raw HTTP/1.1 request: (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT") else ""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{length}"
                 f"{headers}Connection: close\r\n\r\n".encode() + body)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return int(status.split()[1]), {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}, \
        payload


def openai_error(payload: bytes) -> dict:
    """The error object of an OpenAI-shaped error body (and nothing else in it)."""
    body = json.loads(payload)
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize("method, path, allow", [
    ("PUT", "/v1/chat/completions", "OPTIONS, POST"),
    ("GET", "/v1/chat/completions", "OPTIONS, POST"),
    ("DELETE", "/v1/chat/completions", "OPTIONS, POST"),
    ("PUT", "/v1/models", "GET, HEAD, OPTIONS"),
    ("POST", "/v1/models/fake-model", "GET, HEAD, OPTIONS"),
    ("POST", "/health", "GET, HEAD, OPTIONS"),
    ("PATCH", "/metrics", "GET, HEAD, OPTIONS"),
    ("POST", "/ready", "GET, HEAD, OPTIONS"),
    ("POST", "/", "GET, HEAD, OPTIONS"),
])
async def test_a_wrong_method_gets_405_with_allow(server, method, path, allow):
    status, headers, payload = await request(server, method, path, b"{}" if method != "GET" else b"")
    assert status == 405 and headers["allow"] == allow
    assert openai_error(payload)["code"] == "method_not_allowed"


@pytest.mark.parametrize("path, allow", [("/v1/chat/completions", "OPTIONS, POST"),
                                         ("/v1/models", "GET, HEAD, OPTIONS"), ("/health", "GET, HEAD, OPTIONS"),
                                         ("/", "GET, HEAD, OPTIONS")])
async def test_options_says_what_the_route_takes(server, path, allow):
    status, headers, payload = await request(server, "OPTIONS", path)
    assert status == 204 and headers["allow"] == allow and payload == b""


async def test_head_is_get_without_the_body(server):
    status, headers, payload = await request(server, "HEAD", "/v1/models")
    got, _, body = await request(server, "GET", "/v1/models")
    assert (status, got) == (200, 200) and payload == b"" and int(headers["content-length"]) == len(body)


async def test_an_unknown_path_under_v1_is_404_for_every_method(server):
    for method in ("GET", "PUT", "OPTIONS"):
        status, _, payload = await request(server, method, "/v1/no/such/thing")
        assert status == 404 and openai_error(payload)["code"] == "unknown_url"


async def test_a_body_nested_too_deep_for_the_parser_gets_an_openai_400(server):
    deep = ("[" * 3000 + "]" * 3000).encode()
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": ' + deep + b"}"
    status, _, payload = await request(server, "POST", "/v1/chat/completions", body)
    error = openai_error(payload)
    assert status == 400 and error["code"] == "invalid_json" and "deeper" in error["message"]
    status, _, payload = await request(server, "POST", "/v1/chat/completions", b'{"model": ')
    assert status == 400 and openai_error(payload)["code"] == "invalid_value"  # plain bad JSON: said so too


async def test_a_body_past_the_limit_is_refused_before_it_is_parsed(server):
    # Larger than the sockets buffer: answered and closed before it is read, the client would get a reset.
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 900_000}]}).encode()
    status, _, payload = await request(server, "POST", "/v1/chat/completions", big)
    assert status == 413 and openai_error(payload)["code"] == "request_too_large"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 8192]), big[i:i + 8192]) for i in range(0, len(big), 8192))
    status, _, payload = await request(server, "POST", "/v1/chat/completions", chunks + b"0\r\n\r\n",
                                       "Transfer-Encoding: chunked\r\n")
    assert status == 413 and openai_error(payload)["code"] == "request_too_large"  # no length stated: counted


async def test_nulls_that_openai_allows_are_read_as_the_defaults(server):
    nulls = {**CHAT, "stream": None, "temperature": None, "top_p": None, "n": None, "stop": None, "seed": None,
             "max_tokens": None, "stream_options": None, "tools": None, "tool_choice": None,
             "response_format": None, "logprobs": None, "top_logprobs": None, "parallel_tool_calls": None}
    status, _, payload = await request(server, "POST", "/v1/chat/completions", json.dumps(nulls).encode())
    assert status == 200 and json.loads(payload)["object"] == "chat.completion"
