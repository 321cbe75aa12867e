"""SIP messages as this user agent writes them (RFC 3261 section 8): responses copied from their request's
headers, and requests of its own within a dialog or to a registrar. Parsing and the headers' grammar are
`sipmessage`'s."""

import secrets
from typing import TypeVar

from sipmessage import URI, Address, CSeq, Request, Response, Via

AGENT = "voicepipe"
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY"
PHRASES = {100: "Trying", 180: "Ringing", 200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           415: "Unsupported Media Type", 480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist",
           486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here", 491: "Request Pending",
           500: "Server Internal Error", 503: "Service Unavailable", 603: "Decline"}
REQUIRED = ("Via", "From", "To", "Call-ID", "CSeq")
Message = TypeVar("Message", Request, Response)


def new_tag() -> str:
    return secrets.token_hex(6)


def new_branch() -> str:
    return "z9hG4bK" + secrets.token_hex(8)  # RFC 3261's magic cookie, then a unique part


def check(request: Request) -> None:
    """ValueError unless the request has every header a response needs, and they parse."""
    for name in REQUIRED:
        if request.headers.get(name) is None:
            raise ValueError(f"no {name} header")
    request.via, request.from_address, request.to_address, request.cseq  # noqa: B018 - parsed, to fail early
    if request.cseq.method != request.method:
        raise ValueError("the CSeq method differs from the request's")


def response(request: Request, code: int, to_tag: str | None = None, body: bytes = b"",
             content_type: str | None = None, extra: dict[str, str] | None = None) -> Response:
    """A response to `request`: its Via, From, Call-ID and CSeq, and its To with `to_tag` added."""
    reply = Response(code, PHRASES.get(code, "Unknown"), body)
    for via in request.headers.getlist("Via"):
        reply.headers.add("Via", via)
    reply.headers.add("From", request.headers.get("From") or "")
    to = request.to_address
    if to_tag and "tag" not in to.parameters and code > 100:
        to = Address(to.uri, to.name, to.parameters.replace(tag=to_tag))
    reply.headers.add("To", str(to))
    reply.headers.add("Call-ID", request.call_id)
    reply.headers.add("CSeq", str(request.cseq))
    return _closed(reply, "Server", extra, content_type)


def request(method: str, uri: URI, via_host: str, via_port: int, from_address: Address, to_address: Address,
            call_id: str, cseq: int, contact: Address | None = None, route: list[Address] | None = None,
            body: bytes = b"", content_type: str | None = None, extra: dict[str, str] | None = None) -> Request:
    """A request of this side's, with a new branch (a new transaction)."""
    message = Request(method, uri, body)
    message.headers.add("Via", f"SIP/2.0/UDP {_host(via_host)}:{via_port};branch={new_branch()};rport")
    message.headers.add("Max-Forwards", "70")
    for hop in route or []:
        message.headers.add("Route", str(hop))
    message.headers.add("From", str(from_address))
    message.headers.add("To", str(to_address))
    message.headers.add("Call-ID", call_id)
    message.headers.add("CSeq", str(CSeq(cseq, method)))
    if contact is not None:
        message.headers.add("Contact", str(contact))
    return _closed(message, "User-Agent", extra, content_type)


def _closed(message: Message, agent_header: str, extra: dict[str, str] | None, content_type: str | None) -> Message:
    """The headers every message of this side ends with: the caller's extra ones, who wrote it, its body's."""
    for name, value in (extra or {}).items():
        message.headers.add(name, value)
    message.headers.add(agent_header, AGENT)
    if content_type:
        message.headers.add("Content-Type", content_type)
    message.headers.add("Content-Length", str(len(message.body)))
    return message


def branch(message: Request | Response) -> str:
    via: Via = message.via[0]
    return str(via.parameters.get("branch") or "")


def contact_uri(host: str, port: int, user: str = "voicepipe") -> Address:
    return Address(URI("sip", _host(host), user=user, port=port))


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
