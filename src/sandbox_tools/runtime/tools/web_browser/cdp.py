"""A DevTools protocol connection over the browser's two pipes, on asyncio.

Every command has a deadline: a browser that does not answer a browser-level command in
time is treated as hung (`BrowserFailed`), and so is one whose pipe closes or that sends
bytes that are not the protocol (a page that does not answer is a `PageTimeout`, which
the controller judges); the controller then kills it and the next call starts a fresh
one. An error the browser answers with (a node that no longer exists, a navigation it refused) is a
`CdpCommandError`: the page's problem, reported to the model, not the browser's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
from collections.abc import Callable
from typing import Any

from sandbox_tools.protocol import ErrorReason, json_values
from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.tools.web_browser.cdp_framing import (
    CdpFramingError,
    CdpMessage,
    FrameSplitter,
    encode_command,
    parse_frame,
)


class BrowserFailed(ToolError):
    """The browser crashed, hung or broke the protocol; it is stopped, and the next call
    starts a fresh one (this call's pages are lost)."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the browser failed: {reason}. It was stopped; the next call starts a fresh "
            "browser, where every session begins again on a blank page",
            ErrorReason.BROWSER_FAILED,
        )
        self.reason = reason


class CdpCommandError(Exception):
    """The browser answered a command with an error."""


class PageTimeout(CdpCommandError):
    """A command sent to a page was not answered in time: the page's problem (a script
    spinning, a server that never answers) until a browser-level command also goes
    unanswered."""

    def __init__(self, method: str, timeout: float) -> None:
        super().__init__(f"the page did not answer {method} within {timeout:g} s")
        self.method = method


# The events we act on are a few hundred bytes; a bigger one is dropped unparsed (anything
# of the browser's uid can write frames into our pipe, and parsing costs far more memory
# and time than the bytes do).
MAX_EVENT_BYTES = 64 * 1024
# A reply's JSON values at most (counted in C before parsing, as protocol.json_values
# does): the tree and the snapshot of a page of 50,000 links hold a few million.
MAX_REPLY_VALUES = 6_000_000
# Replies bigger than this are parsed in a thread, not in the event loop's own turn.
PARSE_IN_THREAD_BYTES = 1024 * 1024
# How a reply the browser writes begins; a big frame that does not begin so is no reply.
_REPLY_HEAD = re.compile(rb'\{"id":([0-9]{1,15})[,}]')


EventHandler = Callable[[CdpMessage], None]


class _Reader(asyncio.Protocol):
    def __init__(self, connection: CdpConnection) -> None:
        self.connection = connection

    def data_received(self, data: bytes) -> None:
        self.connection._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.fail("its DevTools pipe closed (the browser exited or crashed)")


class CdpConnection:
    """Commands out on one pipe, replies and events back on the other."""

    def __init__(self, max_frame_bytes: int, on_event: EventHandler) -> None:
        self._splitter = FrameSplitter(max_frame_bytes)
        self._on_event = on_event
        self._ids = itertools.count(1)
        # Calls waiting for their answer, with the page session each was sent to.
        self._pending: dict[int, tuple[str | None, asyncio.Future[dict[str, Any]]]] = {}
        self._writer: asyncio.WriteTransport | None = None
        self._reader: asyncio.ReadTransport | None = None
        self.failure: str | None = None  # why the connection is unusable, once it is
        self.lost = asyncio.Event()
        self.dropped_events = 0  # events past MAX_EVENT_BYTES, dropped unparsed
        self._parsing: set[asyncio.Future[CdpMessage]] = set()

    async def open(self, read_fd: int, write_fd: int) -> None:
        """Take ownership of our ends of the two pipes."""
        loop = asyncio.get_running_loop()
        self._reader, _ = await loop.connect_read_pipe(
            lambda: _Reader(self), os.fdopen(read_fd, "rb", buffering=0)
        )
        self._writer, _ = await loop.connect_write_pipe(
            asyncio.BaseProtocol, os.fdopen(write_fd, "wb", buffering=0)
        )

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        timeout: float,
    ) -> dict[str, Any]:
        if self.failure is not None or self._writer is None:
            raise BrowserFailed(self.failure or "it is not connected")
        message_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = (session_id, future)
        try:
            self._writer.write(encode_command(message_id, method, params, session_id))
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            if session_id is not None:
                # A page that does not answer is that page's problem; the controller asks
                # the browser itself before calling the browser hung.
                raise PageTimeout(method, timeout) from None
            self.fail(f"it did not answer {method} within {timeout:g} s")
            raise BrowserFailed(f"it did not answer {method} within {timeout:g} s") from None
        except (BrokenPipeError, ConnectionResetError):
            self.fail("its DevTools pipe closed (the browser exited or crashed)")
            raise BrowserFailed(self.failure or "its pipe closed") from None
        finally:
            self._pending.pop(message_id, None)

    def close(self) -> None:
        self.fail("it was stopped")
        for parsing in self._parsing:
            parsing.cancel()
        for transport in (self._writer, self._reader):
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()

    def _received(self, data: bytes) -> None:
        try:
            frames = self._splitter.feed(data)
            for frame in frames:
                if len(frame) > MAX_EVENT_BYTES:
                    self._big_frame(frame)
                else:
                    self._deliver(parse_frame(frame))
        except CdpFramingError as exc:
            self._broke(str(exc))

    def _broke(self, reason: str) -> None:
        self.fail(reason)
        if self._reader is not None:
            self._reader.close()

    def _big_frame(self, frame: bytes) -> None:
        """A frame past MAX_EVENT_BYTES is kept only as the reply to a call waiting for
        it, of at most MAX_REPLY_VALUES values; the biggest are parsed in a thread."""
        head = _REPLY_HEAD.match(frame)
        waiting = self._pending.get(int(head[1])) if head is not None else None
        if waiting is None or waiting[1].done():
            self.dropped_events += 1
            return
        future = waiting[1]
        values = json_values(frame)
        if values > MAX_REPLY_VALUES:
            future.set_exception(
                CdpCommandError(
                    f"the browser's answer holds more than {MAX_REPLY_VALUES} JSON values "
                    f"({values}); it was not read"
                )
            )
            return
        if len(frame) <= PARSE_IN_THREAD_BYTES:
            self._deliver(parse_frame(frame))
            return
        parsing = asyncio.ensure_future(asyncio.to_thread(parse_frame, frame))
        self._parsing.add(parsing)
        parsing.add_done_callback(self._parsed)

    def _parsed(self, parsing: asyncio.Future[CdpMessage]) -> None:
        self._parsing.discard(parsing)
        if parsing.cancelled() or self.failure is not None:
            return
        exc = parsing.exception()
        if isinstance(exc, CdpFramingError):
            self._broke(str(exc))
        elif exc is not None:
            self._broke(f"its answer could not be read ({exc})")
        else:
            self._deliver(parsing.result())

    def _deliver(self, message: CdpMessage) -> None:
        if message.id is None:
            self._on_event(message)
            return
        _, future = self._pending.get(message.id, (None, None))
        if future is None or future.done():
            return  # the answer to a call that already gave up
        if message.error is not None:
            future.set_exception(CdpCommandError(message.error))
        else:
            future.set_result(message.result or {})

    def fail(self, reason: str) -> BrowserFailed:
        """Mark the connection unusable (the first reason sticks), fail every call still
        waiting, and return the error to raise for `reason`."""
        if self.failure is None:
            self.failure = reason
        self.lost.set()
        for _, future in self._pending.values():
            if not future.done():
                future.set_exception(BrowserFailed(self.failure))
        return BrowserFailed(reason)

    def fail_page(self, session_id: str, reason: str) -> None:
        """A page's renderer died: the calls sent to it will never be answered, so they
        fail now as the page's error (the browser itself is fine)."""
        for target, future in self._pending.values():
            if target == session_id and not future.done():
                future.set_exception(CdpCommandError(reason))
