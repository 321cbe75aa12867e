"""The page's protocol module mirrors the server's: every name `web/protocol.js` sends or reads is the
server's, under the same constant name (a renamed event on one side fails here, not in a browser)."""

import re
from pathlib import Path

from voicepipe.protocol import ClientEvent, ServerEvent

PROTOCOL_JS = Path(__file__).resolve().parents[2] / "web" / "protocol.js"


def js_table(name: str) -> dict[str, str]:
    """The constants of one frozen object in protocol.js: {NAME: "event.name"}."""
    body = re.search(rf"export const {name} = Object\.freeze\(\{{(.*?)\}}\);", PROTOCOL_JS.read_text(), re.S)
    assert body, f"no {name} in {PROTOCOL_JS}"
    return dict(re.findall(r'^\s*([A-Z_]+): "([^"]+)"', body.group(1), re.M))


def py_table(cls: type) -> dict[str, str]:
    return {k: v for k, v in vars(cls).items() if k.isupper()}


def test_every_event_the_page_sends_is_one_the_server_takes_under_the_same_name():
    page, server = js_table("ClientEvent"), py_table(ClientEvent)
    assert page and {k: server.get(k) for k in page} == page


def test_every_event_the_page_reads_is_one_the_server_sends_under_the_same_name():
    page, server = js_table("ServerEvent"), py_table(ServerEvent)
    assert len(page) > 10 and {k: server.get(k) for k in page} == page
