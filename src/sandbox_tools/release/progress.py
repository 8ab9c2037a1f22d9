"""How long transfers report progress, without tying the release code to a terminal.

The CLI passes a rich-backed implementation; library callers and tests get `NoProgress`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Transfers(Protocol):
    def start(self, label: str, total: int, completed: int = 0) -> Callable[[int], None]:
        """Begin a transfer of `total` bytes; the returned callback takes byte increments."""

    def finish(self, label: str) -> None: ...

    def note(self, message: str) -> None:
        """A line worth showing the user (retry, resume, skip)."""


class NoProgress:
    """Nobody watching: for fetches and releases called as a library (and the tests)."""

    def start(self, label: str, total: int, completed: int = 0) -> Callable[[int], None]:
        return lambda _n: None

    def finish(self, label: str) -> None: ...

    def note(self, message: str) -> None: ...

    def outcome(self, target: str, name: str, action: str) -> None: ...

    def validated(self, coverage: Any) -> None: ...
