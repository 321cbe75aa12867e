"""Keys the caller presses on the phone's keypad, gathered into one message once they pause.

"Press 1 for sales" and a PIN typed digit by digit are both one answer: the digits join the conversation
together, as the caller's message, when no key has come for PAUSE_S.
"""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

PAUSE_S = 1.5


def keypad_text(digits: list[str]) -> str:
    """The caller's message a run of keys stands for."""
    return f"[The caller pressed on the phone's keypad: {' '.join(digits)}]"


class Keypad:
    """Gathers the digits of one entry; `entered` gets their message once the caller pauses."""

    def __init__(self, spawn: Callable[[Coroutine], Any], entered: Callable[[str], None]) -> None:
        self.spawn, self.entered = spawn, entered
        self._digits: list[str] = []
        self._timer: asyncio.Task | None = None

    def press(self, digit: str) -> None:
        self._digits.append(digit)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.spawn(self._after_pause())

    async def _after_pause(self) -> None:
        await asyncio.sleep(PAUSE_S)
        digits, self._digits, self._timer = self._digits, [], None
        self.entered(keypad_text(digits))
