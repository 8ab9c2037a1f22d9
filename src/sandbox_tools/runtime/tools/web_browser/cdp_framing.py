"""The DevTools protocol's framing on `--remote-debugging-pipe`: pure, no I/O.

Chromium reads commands from its fd 3 and writes replies and events to its fd 4, each
message one JSON document ended by a NUL byte. The browser runs as the agent's identity,
so anything of that uid that can take the browser's descriptor (ptrace, pidfd_getfd) can
write into our end of the pipe: every frame is bounded in bytes before it is kept (and
in values before it is parsed, cdp.py), and parsed strictly into a `CdpMessage` or a
`CdpFramingError`, never into an exception the server does not expect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TERMINATOR = b"\x00"


class CdpFramingError(ValueError):
    """The browser sent bytes that are not a DevTools message (or too many of them)."""


def encode_command(
    message_id: int, method: str, params: dict[str, Any] | None, session_id: str | None
) -> bytes:
    """One command frame; `session_id` addresses a page attached with `flatten: true`."""
    message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
    if session_id is not None:
        message["sessionId"] = session_id
    # ensure_ascii keeps NUL out of the frame: a "\u0000" in a string is escaped.
    return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode() + TERMINATOR


class FrameSplitter:
    """Cuts the browser's byte stream into frames of at most `max_frame_bytes`.

    A frame longer than the bound is refused as soon as the bound is passed (not when
    its end finally arrives), so a browser that never sends NUL cannot grow our memory.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._pending = bytearray()
        # How much of _pending is known to hold no terminator: a 6 MB frame arrives in
        # a hundred reads, and searching it from its start each time cost seconds.
        self._searched = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        frames: list[bytes] = []
        start = 0
        while True:
            end = self._pending.find(TERMINATOR, max(start, self._searched))
            if end < 0:
                break
            if end - start > self.max_frame_bytes:
                self._too_long()
            frames.append(bytes(self._pending[start:end]))
            start = end + 1
        del self._pending[:start]
        self._searched = len(self._pending)
        if len(self._pending) > self.max_frame_bytes:
            self._too_long()
        return frames

    def _too_long(self) -> None:
        self._pending.clear()
        self._searched = 0
        raise CdpFramingError(
            f"the browser sent a DevTools message longer than {self.max_frame_bytes} bytes"
        )


@dataclass(frozen=True)
class CdpMessage:
    """A reply (`id` set) or an event (`method` set), as the browser sent it."""

    id: int | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    method: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None

    @property
    def is_reply(self) -> bool:
        return self.id is not None


def parse_frame(frame: bytes) -> CdpMessage:
    """A frame as a reply or an event; anything else is a CdpFramingError."""
    try:
        document = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        raise CdpFramingError(f"the browser sent a frame that is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise CdpFramingError("the browser sent a frame that is not a JSON object")
    session_id = document.get("sessionId")
    if session_id is not None and not isinstance(session_id, str):
        raise CdpFramingError("the browser sent a sessionId that is not a string")
    message_id = document.get("id")
    if message_id is not None:
        if isinstance(message_id, bool) or not isinstance(message_id, int):
            raise CdpFramingError("the browser sent a reply whose id is not an integer")
        error = document.get("error")
        if error is not None:
            text = error.get("message") if isinstance(error, dict) else None
            return CdpMessage(
                id=message_id,
                error=text if isinstance(text, str) else json.dumps(error)[:1000],
                session_id=session_id,
            )
        result = document.get("result", {})
        if not isinstance(result, dict):
            raise CdpFramingError("the browser sent a reply whose result is not an object")
        return CdpMessage(id=message_id, result=result, session_id=session_id)
    method = document.get("method")
    if not isinstance(method, str):
        raise CdpFramingError("the browser sent a frame that is neither a reply nor an event")
    params = document.get("params", {})
    if not isinstance(params, dict):
        raise CdpFramingError(f"the browser sent {method} with params that are not an object")
    return CdpMessage(method=method, params=params, session_id=session_id)
