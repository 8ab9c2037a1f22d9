"""The server's half of the HTTP tunnel (PROTOCOL.md "Model proxy / HTTP tunnel").

The `model_proxy` process accepts HTTP inside the sandbox and hands each request to the
server (`http_tunnel_open`), which sends it to the host as a sandbox -> host message
(`http_request`) the moment it arrives. The host answers with `http_tunnel_respond`
(status and headers, and optionally the body's first chunks) and `http_tunnel_body`
(chunks, as its handler produces them; the last one says `end`); the proxy reads them
with `http_tunnel_read` and writes them to its client at once, so a streamed (SSE)
answer is never buffered whole. A client that goes away becomes `http_cancel` for the
host.

Only the client that owns the sandbox -> host queue (the host, by its secret key) may
answer; request ids are random, so no other client can read or cancel an exchange it
did not open without being told its id.

Bounded: each exchange holds at most MAX_BUFFERED_CHUNKS chunks the proxy has not read;
the host's body call then waits (backpressure), at most BODY_WAIT seconds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import secrets
from dataclasses import dataclass, field
from typing import Any

from sandbox_tools.protocol import (
    HOST_MESSAGE_HTTP_CANCEL,
    HOST_MESSAGE_HTTP_REQUEST,
    tunnel_headers_too_many,
)
from sandbox_tools.runtime.host_messages import HostMessageRefused, HostMessages
from sandbox_tools.runtime.jsonrpc import InvalidParams, Params, ToolError, optional, required

MAX_BUFFERED_CHUNKS = 256
BODY_WAIT = 60.0
MAX_READ_BYTES = 1024 * 1024
DEFAULT_HEAD_TIMEOUT = 300.0
MAX_EXCHANGES = 256
SOURCE = "http"  # the tunnel's share of the sandbox -> host queue


@dataclass
class _Exchange:
    id: str
    head: asyncio.Future[dict[str, Any]]
    chunks: asyncio.Queue[bytes | None] = field(
        default_factory=lambda: asyncio.Queue(MAX_BUFFERED_CHUNKS)
    )
    error: str | None = None


def _b64(value: Any, name: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidParams(f'Invalid params: "{name}" must be base64 text')
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParams(f'Invalid params: "{name}" is not valid base64') from None


def _headers(value: Any) -> list[list[str]]:
    if not isinstance(value, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        for pair in value
    ):
        raise InvalidParams('Invalid params: "headers" must be a list of [name, value] strings')
    too_many = tunnel_headers_too_many(value)
    if too_many:
        raise InvalidParams(f"Invalid params: {too_many}")
    for name, text in value:
        if any(c in name + text for c in "\r\n\x00") or not name:
            raise InvalidParams(f"Invalid params: header {name[:40]!r} has a forbidden character")
    return value


class HttpTunnelController:
    def __init__(self, host: HostMessages) -> None:
        self.host = host
        self._exchanges: dict[str, _Exchange] = {}

    # -- the proxy's side ----------------------------------------------------------------

    async def open(self, params: Params) -> dict[str, Any]:
        """Send one HTTP request to the host; answer with its status and headers."""
        if len(self._exchanges) >= MAX_EXCHANGES:
            raise ToolError(
                f"too many HTTP requests waiting for the host (at most {MAX_EXCHANGES})"
            )
        request = {
            "method": required(params, "method", str),
            "path": required(params, "path", str),
            "headers": _headers(required(params, "headers", list)),
            "body": required(params, "body", str),
        }
        _b64(request["body"], "body")
        timeout = optional(params, "timeout", float, DEFAULT_HEAD_TIMEOUT)
        exchange = _Exchange(f"h{secrets.token_hex(8)}", asyncio.get_running_loop().create_future())
        self._exchanges[exchange.id] = exchange
        try:
            await self.host.put(
                HOST_MESSAGE_HTTP_REQUEST, {"request_id": exchange.id, **request}, SOURCE
            )
            head = await asyncio.wait_for(exchange.head, timeout)
        except HostMessageRefused as exc:
            self._exchanges.pop(exchange.id, None)
            raise ToolError(f"the request cannot be sent to the host: {exc}") from None
        except asyncio.TimeoutError:
            await self._cancel(exchange.id, f"the host did not answer within {timeout:g} s")
            raise ToolError(f"the host did not answer within {timeout:g} s") from None
        except BaseException:
            await self._cancel(exchange.id, "the request was abandoned")
            raise
        return {"request_id": exchange.id, **head}

    async def read(self, params: Params) -> dict[str, Any]:
        """The body chunks that have arrived (waiting up to wait_ms for the first)."""
        exchange = self._exchange(required(params, "request_id", str))
        wait_ms = min(optional(params, "wait_ms", int, 30_000), 60_000)
        chunks: list[bytes] = []
        done = False
        with contextlib.suppress(asyncio.TimeoutError):
            first = await asyncio.wait_for(exchange.chunks.get(), wait_ms / 1000)
            pending: bytes | None = first
            while True:
                if pending is None:
                    done = True
                    break
                chunks.append(pending)
                if sum(map(len, chunks)) >= MAX_READ_BYTES or exchange.chunks.empty():
                    break
                pending = exchange.chunks.get_nowait()
        if done:
            self._exchanges.pop(exchange.id, None)
        return {
            "chunks": [base64.b64encode(c).decode("ascii") for c in chunks],
            "done": done,
            "error": exchange.error if done else None,
        }

    async def cancel(self, params: Params) -> None:
        """The proxy's client went away."""
        await self._cancel(required(params, "request_id", str), "the client disconnected")

    # -- the host's side -----------------------------------------------------------------

    async def respond(self, params: Params) -> None:
        self.host.check_owner(params.get("key"))
        exchange = self._exchange(required(params, "request_id", str))
        status = required(params, "status", int)
        if not 100 <= status <= 599:
            raise InvalidParams(f'Invalid params: "status" {status} is not an HTTP status')
        head = {"status": status, "headers": _headers(required(params, "headers", list))}
        if exchange.head.done():
            raise InvalidParams(f"Invalid params: {exchange.id} was already answered")
        exchange.head.set_result(head)
        if "chunks" in params or "end" in params:  # the body's start in the same call
            await self.body({**params, "chunks": params.get("chunks", [])})

    async def body(self, params: Params) -> None:
        self.host.check_owner(params.get("key"))
        exchange = self._exchange(required(params, "request_id", str))
        chunks = required(params, "chunks", list)
        decoded = [_b64(c, "chunks[]") for c in chunks]
        end = optional(params, "end", bool, False)
        error = params.get("error")
        if error is not None and not isinstance(error, str):
            raise InvalidParams('Invalid params: "error" must be a string')
        try:
            for chunk in decoded:
                if chunk:
                    await asyncio.wait_for(exchange.chunks.put(chunk), BODY_WAIT)
            if end:
                exchange.error = error
                await asyncio.wait_for(exchange.chunks.put(None), BODY_WAIT)
        except asyncio.TimeoutError:
            raise ToolError(
                f"{exchange.id}: the proxy has not read the body for {BODY_WAIT:g} s"
            ) from None

    # -- internals -----------------------------------------------------------------------

    def _exchange(self, request_id: str) -> _Exchange:
        exchange = self._exchanges.get(request_id)
        if exchange is None:
            raise ToolError(f"no HTTP request {request_id!r} is open (it ended or was cancelled)")
        return exchange

    async def _cancel(self, request_id: str, reason: str) -> None:
        exchange = self._exchanges.pop(request_id, None)
        if exchange is None:
            return
        if not exchange.head.done():
            exchange.head.cancel()
        await self.host.put(
            HOST_MESSAGE_HTTP_CANCEL, {"request_id": request_id, "reason": reason}, SOURCE
        )

    def methods(self) -> dict[str, Any]:
        return {
            "http_tunnel_open": self.open,
            "http_tunnel_read": self.read,
            "http_tunnel_cancel": self.cancel,
            "http_tunnel_respond": self.respond,
            "http_tunnel_body": self.body,
        }
