"""Every path answers every method: OPTIONS with the methods its route takes (`Allow`), HEAD as GET
without the body, and any other method the route does not take with 405 and `Allow`, in OpenAI's error
shape. Routing alone would hand a wrong method to whatever else matches the path (the catch-all under
/v1, which says 404, or the web page's files, which say 405 with their own methods)."""

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

FALLBACK = "unknown"  # the name of the catch-all route under /v1: it answers paths no route has
WEB_METHODS = frozenset({"GET", "HEAD"})  # the web page's files, mounted at /


class Methods:
    """`routes`: every route of `app`, those of its included routers too (which it keeps apart)."""

    def __init__(self, app: FastAPI, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = [r for r in routes if isinstance(r, Route) and r.name != FALLBACK and r.methods]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed = self.allowed(scope["path"])
        method = scope["method"]
        if not allowed or method in allowed:
            await self.app(scope, receive, send)
        elif method == "OPTIONS":
            await Response(status_code=204, headers={"Allow": _allow(allowed)})(scope, receive, send)
        elif method == "HEAD" and "GET" in allowed:
            await self.app({**scope, "method": "GET"}, receive, _without_body(send))
        else:
            allow = _allow(allowed)
            body = {"error": {"message": f"{method} is not allowed on {scope['path']}; it takes {allow}",
                              "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}}
            await JSONResponse(body, 405, headers={"Allow": allow})(scope, receive, send)

    def allowed(self, path: str) -> frozenset[str]:
        """The methods some route takes at `path` (the web files' under /, none for a path under /v1 that
        no route has: the catch-all says 404 to every method)."""
        methods: set[str] = set()
        for route in self.routes:
            if route.path_regex.match(path):
                methods |= route.methods
        if not methods and not path.startswith("/v1/"):
            methods = set(WEB_METHODS)
        return frozenset(methods)


def _allow(methods: frozenset[str]) -> str:
    """The Allow header: what the route takes, HEAD with GET, and OPTIONS always."""
    listed = set(methods) | {"OPTIONS"} | ({"HEAD"} if "GET" in methods else set())
    return ", ".join(sorted(listed))


def _without_body(send: Send) -> Send:
    async def head(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return head
