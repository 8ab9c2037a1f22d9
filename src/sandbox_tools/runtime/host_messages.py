"""Sandbox -> host messages (PROTOCOL.md): what the sandbox says first.

An MCP server's own notifications and requests (progress, logging, sampling) and the
model proxy's HTTP requests cannot wait for the host to ask. They are queued here,
numbered, and delivered in order in one of two ways:

- pushed, as JSON-RPC notifications, on the connection that subscribed with
  `host_messages_subscribe` (the persistent `stdio` channel): no polling at all;
- long-polled with `host_messages_poll {key, ack_seq, wait_ms}` -> `{seq, messages,
  server}` by exec-per-call clients, and kept until acknowledged, so a lost response
  loses nothing.

Everything here is fed by untrusted producers (an MCP server is the image's or the
agent's program), so (THREAT_MODEL.md, "Sandbox -> host surfaces"):
- every message is measured as it will travel (escaped JSON) and refused at the
  producer when it could never be delivered (`HostMessageRefused`), instead of
  blocking the head of the queue;
- the queue is bounded in count and bytes overall *and per source* (one MCP session,
  the HTTP tunnel): a source that floods waits on its own quota (an MCP server then
  blocks on its own stdout) while the others' messages keep their place in line;
- one host client owns the queue at a time, by a secret key it chose: another client
  (an agent with the runtime's uid) cannot take the messages over or answer in the
  host's place while the owner is connected or was seen within OWNER_LEASE_S;
- `server` in every answer names this server's life, so a host that reconnects
  learns when a restarted server lost what the old one knew.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandbox_tools.protocol import JSONRPC_VERSION, MAX_JSON_VALUES, VALUE_COST, json_values
from sandbox_tools.runtime.jsonrpc import InvalidParams, Method, Params, ToolError, optional

MAX_QUEUED_MESSAGES = 1024
MAX_QUEUED_BYTES = 64 * 1024 * 1024
# One source's share: past it that source waits, the others do not.
MAX_SOURCE_MESSAGES = 256
MAX_SOURCE_BYTES = 16 * 1024 * 1024
# A source with nothing queued may add a message this small past the overall bound.
FAIR_ENTRY_BYTES = 1024 * 1024
# One message as it travels (escaped JSON, envelope included); a frame is 64 MiB.
MAX_MESSAGE_BYTES = 48 * 1024 * 1024
ENVELOPE_BYTES = 256
MAX_POLL_WAIT_MS = 60_000
MAX_MESSAGES_PER_POLL = 256
MAX_POLL_BYTES = 48 * 1024 * 1024
# How long a polling owner keeps the queue after its last poll (it polls every few s).
OWNER_LEASE_S = 60.0
KEY_LENGTHS = range(16, 129)

Push = Callable[[dict[str, Any]], Awaitable[bool]]


@dataclass(frozen=True)
class Connection:
    """The connection a request arrived on: where a subscription pushes, and whether
    it is still open (an open subscription keeps its owner's claim)."""

    push: Push
    is_open: Callable[[], bool]


# Set by the server for each connection's handler tasks.
CURRENT_CONNECTION: contextvars.ContextVar[Connection | None] = contextvars.ContextVar(
    "current_connection", default=None
)


class HostMessageRefused(ToolError):
    """A message that can never reach the host (too large, or not JSON); its producer
    decides what to tell its own peer."""


@dataclass
class _Queued:
    seq: int
    method: str
    params: dict[str, Any]
    size: int
    source: str


def encoded_size(method: str, params: dict[str, Any]) -> tuple[int, int]:
    """Bytes the message takes on the wire (ASCII-escaped JSON, as `encode` writes it), and
    what it costs the host to hold parsed (`protocol.json_cost`), which shares count in.

    HostMessageRefused if it is not JSON, or may hold more values than the host parses.
    """
    try:
        text = json.dumps(params, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise HostMessageRefused(f"the message is not valid JSON: {exc}") from None
    values = json_values(text)
    if values > MAX_JSON_VALUES:
        raise HostMessageRefused(
            f"the message holds up to {values} JSON values, more than the {MAX_JSON_VALUES} "
            "one message to the host may hold"
        )
    wire = len(text) + len(method) + ENVELOPE_BYTES
    return wire, wire + VALUE_COST * values


class HostMessages:
    def __init__(
        self,
        max_messages: int = MAX_QUEUED_MESSAGES,
        max_bytes: int = MAX_QUEUED_BYTES,
        source_messages: int = MAX_SOURCE_MESSAGES,
        source_bytes: int = MAX_SOURCE_BYTES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        owner_lease: float = OWNER_LEASE_S,
    ) -> None:
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self.source_messages, self.source_bytes = source_messages, source_bytes
        self.max_message_bytes = max_message_bytes
        self.owner_lease = owner_lease
        self.instance = secrets.token_hex(8)  # this server's life, for reconnecting hosts
        self._queue: deque[_Queued] = deque()
        self._bytes = 0
        self._per_source: dict[str, list[int]] = {}  # source -> [messages, bytes]
        self._seq = 0
        self._changed = asyncio.Condition()
        self._pump: asyncio.Task[None] | None = None
        self._subscriber: Connection | None = None
        self._owner: str | None = None
        self._owner_seen = 0.0

    # -- producers -----------------------------------------------------------------------

    def _has_room(self, source: str, size: int) -> bool:
        count, used = self._per_source.get(source, (0, 0))
        # A source with nothing queued always takes one message: nothing else could
        # drain it. Past that, its own quota and the overall bound both hold.
        source_ok = count == 0 or (
            count < self.source_messages and used + size <= self.source_bytes
        )
        overall_ok = (
            not self._queue
            or (len(self._queue) < self.max_messages and self._bytes + size <= self.max_bytes)
            # A quiet source's small message never waits for the others' floods: woken
            # waiters that lose the race wait again at the back, so without this a model
            # proxy request could wait behind three flooding MCP servers for ever.
            or (count == 0 and size <= FAIR_ENTRY_BYTES)
        )
        return source_ok and overall_ok

    async def put(self, method: str, params: dict[str, Any], source: str = "") -> int:
        """Queue a message for the host; waits while `source`'s share or the queue is
        full. Its seq. HostMessageRefused if it could never be delivered."""
        wire, size = encoded_size(method, params)
        if wire > self.max_message_bytes:
            raise HostMessageRefused(
                f"a {wire}-byte message is larger than the {self.max_message_bytes} bytes "
                "one message to the host may take"
            )
        async with self._changed:
            await self._changed.wait_for(lambda: self._has_room(source, size))
            self._seq += 1
            self._queue.append(_Queued(self._seq, method, params, size, source))
            self._bytes += size
            counts = self._per_source.setdefault(source, [0, 0])
            counts[0] += 1
            counts[1] += size
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
            message = self._queue.popleft()
            self._bytes -= message.size
            counts = self._per_source[message.source]
            counts[0] -= 1
            counts[1] -= message.size
            if counts[0] == 0:
                del self._per_source[message.source]

    # -- the owner -------------------------------------------------------------------------

    def _owner_present(self) -> bool:
        if self._subscriber is not None and self._subscriber.is_open():
            return True
        return time.monotonic() - self._owner_seen < self.owner_lease

    def _claim(self, params: Params) -> None:
        key = params.get("key")
        if not isinstance(key, str) or len(key) not in KEY_LENGTHS:
            raise InvalidParams(
                'Invalid params: "key" must be the client\'s secret, 16 to 128 characters'
            )
        if self._owner is not None and self._owner != key and self._owner_present():
            raise ToolError(
                "another client receives this sandbox's messages; a second one is refused "
                f"while it is connected or was seen in the last {self.owner_lease:g} s"
            )
        if self._owner != key:
            self._stop_pump()
        self._owner = key
        self._owner_seen = time.monotonic()

    def check_owner(self, key: Any) -> None:
        """Only the client that receives the messages may answer them (the HTTP tunnel)."""
        if self._owner is None or not isinstance(key, str) or key != self._owner:
            raise ToolError("only the client that receives this sandbox's messages may answer them")
        self._owner_seen = time.monotonic()

    # -- consumers -------------------------------------------------------------------------

    async def poll(self, params: Params) -> dict[str, Any]:
        self._claim(params)
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
            batch: list[_Queued] = []
            size = 0
            for message in self._queue:
                if batch and (
                    len(batch) >= MAX_MESSAGES_PER_POLL or size + message.size > MAX_POLL_BYTES
                ):
                    break
                batch.append(message)
                size += message.size
        self._owner_seen = time.monotonic()
        return {
            "seq": batch[-1].seq if batch else max(ack_seq, self._seq - len(self._queue)),
            "messages": [{"seq": m.seq, "method": m.method, "params": m.params} for m in batch],
            "server": self.instance,
        }

    async def subscribe(self, params: Params) -> dict[str, Any]:
        """Push every message, from now on, on the connection this request came on."""
        connection = CURRENT_CONNECTION.get()
        if connection is None:
            raise InvalidParams(
                "host_messages_subscribe needs a connection that stays open (`stdio`); "
                "over `exec`, poll with host_messages_poll"
            )
        self._claim(params)
        self._stop_pump()  # the owner's older connection, if any, is gone
        self._subscriber = connection
        self._pump = asyncio.create_task(self._deliver(connection.push))
        return {"subscribed": True, "server": self.instance}

    async def release(self, params: Params) -> None:
        """The owner is done: the next client may claim the queue at once."""
        key = params.get("key")
        if key is not None and key == self._owner:
            self._stop_pump()
            self._owner = None
            self._owner_seen = 0.0

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
            self._owner_seen = time.monotonic()
            async with self._changed:
                self._acknowledge(message.seq)
                self._changed.notify_all()

    def _stop_pump(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None
        self._subscriber = None

    def stop(self) -> None:
        self._stop_pump()

    def methods(self) -> dict[str, Method]:
        return {
            "host_messages_poll": self.poll,
            "host_messages_subscribe": self.subscribe,
            "host_messages_release": self.release,
        }
