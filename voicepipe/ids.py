"""Ids for calls, items and responses, in the OpenAI Realtime API's style (`item_3f9a...`)."""

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"
