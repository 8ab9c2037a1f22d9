"""Sandbox -> host messages (PROTOCOL.md): what the sandbox says first.

An MCP server's own notifications and requests (progress, logging, sampling), and later
the model proxy's HTTP requests, cannot wait for the host to ask. They are queued here,
numbered, and delivered in order in one of two ways:

- pushed, as JSON-RPC notifications, on the connection that subscribed with
  `host_messages_subscribe` (the persistent `stdio` channel): no polling at all;
- long-polled with `host_messages_poll {ack_seq, wait_ms}` -> `{seq, messages}` by
  exec-per-call clients, and kept until acknowledged, so a lost response loses nothing.

The queue is bounded: when the host does not drain it, producers wait (an MCP server
whose stdout is not read blocks on its own write), and memory stays flat.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandbox_tools.protocol import JSONRPC_VERSION
from sandbox_tools.runtime.jsonrpc import InvalidParams, Method, Params, optional

MAX_QUEUED_MESSAGES = 1024
MAX_QUEUED_BYTES = 16 * 1024 * 1024
MAX_POLL_WAIT_MS = 60_000
MAX_MESSAGES_PER_POLL = 256

# The connection a request arrived on, for `host_messages_subscribe`: set by the server
# for each connection's handler tasks.
Push = Callable[[dict[str, Any]], Awaitable[bool]]
CURRENT_PUSH: contextvars.ContextVar[Push | None] = contextvars.ContextVar(
    "current_push", default=None
)


@dataclass
class _Queued:
    seq: int
    method: str
    params: dict[str, Any]
    size: int


class HostMessages:
    def __init__(
        self, max_messages: int = MAX_QUEUED_MESSAGES, max_bytes: int = MAX_QUEUED_BYTES
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._queue: deque[_Queued] = deque()
        self._bytes = 0
        self._seq = 0
        self._changed = asyncio.Condition()
        self._pump: asyncio.Task[None] | None = None

    def _has_room(self) -> bool:
        # An empty queue always takes one message, however large: nothing could drain it.
        return not self._queue or (
            len(self._queue) < self.max_messages and self._bytes < self.max_bytes
        )

    async def put(self, method: str, params: dict[str, Any]) -> int:
        """Queue a notification for the host; waits while the queue is full. Its seq."""
        size = len(json.dumps(params))
        async with self._changed:
            await self._changed.wait_for(self._has_room)
            self._seq += 1
            self._queue.append(_Queued(self._seq, method, params, size))
            self._bytes += size
            self._changed.notify_all()
            return self._seq

    def _delivered(self, seq: int) -> bool:
        return not self._queue or self._queue[0].seq > seq

    async def wait_delivered(self, seq: int, timeout: float) -> None:
        """Until the host has received message `seq` (and all before it), or `timeout`."""
        async with self._changed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._delivered(seq)), timeout
                )

    def _acknowledge(self, ack_seq: int) -> None:
        while self._queue and self._queue[0].seq <= ack_seq:
            self._bytes -= self._queue.popleft().size

    async def poll(self, params: Params) -> dict[str, Any]:
        ack_seq = optional(params, "ack_seq", int, 0)
        wait_ms = optional(params, "wait_ms", int, 0)
        if ack_seq < 0 or wait_ms < 0:
            raise InvalidParams('Invalid params: "ack_seq" and "wait_ms" must be >= 0')
        async with self._changed:
            self._acknowledge(ack_seq)
            self._changed.notify_all()  # room for waiting producers
            if not self._queue and wait_ms:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: bool(self._queue)),
                        min(wait_ms, MAX_POLL_WAIT_MS) / 1000,
                    )
            batch = list(self._queue)[:MAX_MESSAGES_PER_POLL]
        return {
            "seq": batch[-1].seq if batch else max(ack_seq, self._seq - len(self._queue)),
            "messages": [{"seq": m.seq, "method": m.method, "params": m.params} for m in batch],
        }

    async def subscribe(self, params: Params) -> dict[str, Any]:
        """Push every message, from now on, on the connection this request came on."""
        push = CURRENT_PUSH.get()
        if push is None:
            raise InvalidParams(
                "host_messages_subscribe needs a connection that stays open (`stdio`); "
                "over `exec`, poll with host_messages_poll"
            )
        if self._pump is not None:
            self._pump.cancel()  # the newest subscriber wins: the older one is gone
        self._pump = asyncio.create_task(self._deliver(push))
        return {"subscribed": True}

    async def _deliver(self, push: Push) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self._queue))
                message = self._queue[0]
            notification = {
                "jsonrpc": JSONRPC_VERSION,
                "method": message.method,
                "params": {**message.params, "seq": message.seq},
            }
            if not await push(notification):
                return  # the connection is gone; the message stays for the next one
            async with self._changed:
                self._acknowledge(message.seq)
                self._changed.notify_all()

    def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()

    def methods(self) -> dict[str, Method]:
        return {"host_messages_poll": self.poll, "host_messages_subscribe": self.subscribe}
