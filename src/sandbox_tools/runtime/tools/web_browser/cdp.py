"""A DevTools protocol connection over the browser's two pipes, on asyncio.

Every command has a deadline: a browser that does not answer in time is treated as hung
(`BrowserFailed`), and so is one whose pipe closes or that sends bytes that are not the
protocol; the controller then kills it and the next call starts a fresh one. An error the
browser answers with (a node that no longer exists, a navigation it refused) is a
`CdpCommandError`: the page's problem, reported to the model, not the browser's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Callable
from typing import Any

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
            "browser, where every session begins again on a blank page"
        )
        self.reason = reason


class CdpCommandError(Exception):
    """The browser answered a command with an error."""


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
            self.fail(f"it did not answer {method} within {timeout:g} s")
            raise BrowserFailed(f"it did not answer {method} within {timeout:g} s") from None
        except (BrokenPipeError, ConnectionResetError):
            self.fail("its DevTools pipe closed (the browser exited or crashed)")
            raise BrowserFailed(self.failure or "its pipe closed") from None
        finally:
            self._pending.pop(message_id, None)

    def close(self) -> None:
        self.fail("it was stopped")
        for transport in (self._writer, self._reader):
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()

    def _received(self, data: bytes) -> None:
        try:
            frames = self._splitter.feed(data)
            for frame in frames:
                self._deliver(parse_frame(frame))
        except CdpFramingError as exc:
            self.fail(str(exc))
            if self._reader is not None:
                self._reader.close()

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
