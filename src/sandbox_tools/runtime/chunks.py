"""Responses too large for the caller's exec output limit, handed out in pieces.

inspect_ai caps what one `sandbox.exec` may print (10 MiB by default) and tells the
CLI its cap; a larger response (a big `view`, a long exec_remote output) is kept
here and the first piece returned instead, in the envelope inspect's host expects.
The host then asks for the rest by handle and offset and releases the handle.

Held responses live only in the server's memory (readable by nobody else in the
container) and are bounded in number, bytes and age: the oldest is dropped first,
and a dropped handle is a clear -32000 error, never a wrong answer.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sandbox_tools.protocol import (
    CONTINUATION_UNKNOWN,
    INTERNAL_ERROR,
    JSONRPC_VERSION,
    RESPONSE_CHUNK_FIELD,
    RESPONSE_CHUNK_VERSION,
    RESPONSE_MAX_BYTES_ENV,
)
from sandbox_tools.runtime.jsonrpc import (
    Envelope,
    InvalidParams,
    Params,
    RpcError,
    encode,
    error_response,
    optional,
    required,
)

MAX_HELD_RESPONSES = 16
MAX_HELD_BYTES = 256 * 1024 * 1024
HELD_TTL_S = 600.0
_HANDLE_HEX = 32
# The envelope around the data with every number at its widest: what a piece costs.
_WIDEST = 10**15
_ID_MARGIN = 64


@dataclass
class _Held:
    data: bytes
    piece: int  # data bytes per piece: fixed when the response is held
    created: float


def _piece_size(limit: int, request_id: Any) -> int:
    """How many response bytes fit in one frame of at most `limit` bytes (newline included)."""
    empty = _envelope(request_id, "0" * _HANDLE_HEX, _WIDEST, _WIDEST, _WIDEST, b"")
    # Margin: a continuation request may carry a longer id than the first one did.
    room = limit - len(encode(empty)) - _ID_MARGIN
    return max(0, room // 4 * 3)  # base64 turns 3 bytes into 4 characters


def _envelope(
    request_id: Any, handle: str, offset: int, next_offset: int, total: int, data: bytes
) -> dict[str, Any]:
    return {
        "jsonrpc": JSONRPC_VERSION,
        "id": request_id,
        RESPONSE_CHUNK_FIELD: {
            "version": RESPONSE_CHUNK_VERSION,
            "handle": handle,
            "offset": offset,
            "next_offset": next_offset,
            "total_size": total,
            "done": next_offset == total,
            "chunk": base64.b64encode(data).decode("ascii"),
        },
    }


class HeldResponses:
    def __init__(self) -> None:
        self._held: OrderedDict[str, _Held] = OrderedDict()

    def fit(self, frame: bytes, limit: int | None) -> bytes:
        """`frame` itself if it fits `limit`, else its first piece (the rest is held)."""
        if limit is None or len(frame) <= limit:
            return frame
        response = frame.rstrip(b"\n")
        request_id = json.loads(response).get("id")
        piece = _piece_size(limit, request_id)
        if piece == 0:
            error = RpcError(
                INTERNAL_ERROR,
                f"the response is {len(response)} bytes and the caller's limit of {limit} bytes "
                f"is too small to carry even a piece of it; raise {RESPONSE_MAX_BYTES_ENV}",
            )
            return encode(error_response(request_id, error))
        handle = secrets.token_hex(_HANDLE_HEX // 2)
        self._expire()
        self._held[handle] = _Held(response, piece, time.monotonic())
        self._bound()
        return encode(self._piece(request_id, handle, 0))

    async def continuation(self, params: Params) -> Envelope:
        handle = required(params, "handle", str)
        held = self._held.get(handle)
        if optional(params, "release", bool, False):
            self._held.pop(handle, None)
            return Envelope(result=None)
        self._expire()
        if held is None or handle not in self._held:
            raise RpcError(
                CONTINUATION_UNKNOWN,
                f"response handle {handle[:40]!r} is unknown or expired (held responses are "
                f"dropped after {HELD_TTL_S:g} s, or when more than {MAX_HELD_RESPONSES} wait)",
            )
        offset = required(params, "offset", int)
        if not 0 <= offset < len(held.data):
            raise InvalidParams(
                f'Invalid params: field "offset" must be from 0 to {len(held.data) - 1}, '
                f"got {offset}"
            )
        envelope = self._piece(None, handle, offset)
        envelope.pop("jsonrpc")
        envelope.pop("id")
        return Envelope(**envelope)

    def _piece(self, request_id: Any, handle: str, offset: int) -> dict[str, Any]:
        held = self._held[handle]
        data = held.data[offset : offset + held.piece]
        total = len(held.data)
        return _envelope(request_id, handle, offset, offset + len(data), total, data)

    def _expire(self) -> None:
        now = time.monotonic()
        for handle, held in list(self._held.items()):
            if now - held.created > HELD_TTL_S:
                del self._held[handle]

    def _bound(self) -> None:
        while len(self._held) > MAX_HELD_RESPONSES or (
            len(self._held) > 1 and sum(len(h.data) for h in self._held.values()) > MAX_HELD_BYTES
        ):
            self._held.popitem(last=False)
