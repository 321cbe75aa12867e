"""schemathesis hooks for the HTTP conformance test (loaded by name through SCHEMATHESIS_HOOKS): bodies
that ask for what this server refuses by name, as a text-only server of one model (each refusal is tested
on its own, with its reason), are not generated: they would test nothing more."""

import schemathesis


def asks_what_is_refused(body: dict) -> bool:
    if body.get("logprobs") or body.get("top_logprobs") or (isinstance(body.get("n"), int) and body["n"] > 1):
        return True  # unsupported_parameter, named
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") != "text" for p in content):
            return True  # images, audio, files: the server reads text
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list) and any(isinstance(c, dict) and c.get("type") != "function" for c in calls):
            return True  # custom tools' calls: the server has function tools only
    tools = body.get("tools")
    return isinstance(tools, list) and any(isinstance(t, dict) and t.get("type") != "function" for t in tools)


@schemathesis.hook
def filter_body(context, body) -> bool:
    return not (isinstance(body, dict) and asks_what_is_refused(body))
