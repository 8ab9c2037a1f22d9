"""The gateway's browser: the runtime's own `browser-mcp` server in the sandbox, relayed.

The runtime already serves its headless browser as MCP tools (`browser_navigate`,
`browser_click`, ..., runtime/tools/web_browser/mcp_tools.py: their names, descriptions
and the params dataclasses their arguments are parsed with). The gateway lists the same
tools with `sandbox` added, checks the arguments by the same dataclasses, and relays each
call to that server in the sandbox, started on the sandbox's first browser call (the
add-on installed first, as for every host) and kept until the sandbox is closed. So a
browser tool is declared once, in the runtime, for every surface.

Whatever answers in the sandbox is untrusted: text is bounded by the caller, an image is
kept only if it is base64 of a PNG within the runtime's own size bound.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import struct
from dataclasses import dataclass, make_dataclass
from datetime import timedelta
from typing import Any

from mcp import ClientSession, StdioServerParameters, types

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.addon_delivery import ensure_browser
from sandbox_tools.injector.inject import ToolSupport
from sandbox_tools.injector.jsonrpc_client import MAX_SCREENSHOT_BYTES, PNG_SIGNATURE
from sandbox_tools.injector.mcp_client import sandbox_mcp_client
from sandbox_tools.injector.web_browser import BROWSER_MCP_COMMAND
from sandbox_tools.runtime.jsonrpc import WireParams, wire
from sandbox_tools.runtime.tools.web_browser.mcp_tools import TOOLS as RUNTIME_TOOLS
from sandbox_tools.runtime.tools.web_browser.mcp_tools import McpTool

__all__ = ["RUNTIME_TOOLS", "SandboxBrowser", "arguments_of"]

log = logging.getLogger(__name__)

# A browser call: the browser's start and a page's load have the runtime's 30 s each;
# the host waits for both and the transport, and no longer (a server that does not
# answer is not ours: the call fails, and the next one starts the server again).
CALL_TIMEOUT = 120.0
# The server answering `initialize` (the add-on is installed before, on its own bounds).
START_TIMEOUT = 30.0
CLOSE_TIMEOUT = 10.0
# Images one answer passes on (a screenshot is one), and the most pixels a side each may
# declare: the client decodes them on the host, and a small PNG can declare gigabytes.
MAX_IMAGES = 1
MAX_IMAGE_SIDE = 8192
# The field the runtime's server holds itself, one session per connection.
SESSION_FIELD = "session_name"
# What the model reads about fields the runtime leaves without a doc.
DOCS = {"action": "list, select, new or close (see the tool's description)."}
FIRST_CALL_NOTE = (
    " The first browser call in a sandbox installs the browser there (a few seconds); "
    "each sandbox has one browser, its tabs kept until sandbox_close."
)


@dataclass(frozen=True, kw_only=True)
class _NoParams(WireParams):
    """A browser tool that takes nothing but the session (snapshot, back, screenshot)."""

    session_name: str = ""


def arguments_of(tool: McpTool, sandbox_doc: str) -> type[WireParams]:
    """The gateway's arguments of a runtime browser tool: its params dataclass with
    `sandbox` added (the session is the gateway's to fill)."""
    base = tool.params or _NoParams
    made = make_dataclass(
        f"{base.__name__}WithSandbox",
        [("sandbox", str, wire(doc=sandbox_doc))],
        bases=(base,),
        frozen=True,
        kw_only=True,
    )
    made.__module__ = __name__
    return made


@dataclass(frozen=True)
class Relayed:
    """What the browser server answered, bounded and checked: its text parts joined,
    its PNG images (base64), and whether it was an error."""

    text: str
    images: tuple[str, ...]
    is_error: bool


class SandboxBrowser:
    """The `browser-mcp` server in one sandbox and an MCP session with it. The session
    lives in a task of its own: the SDK's streams must be closed by the task that opened
    them, and each tool call is a task of its own."""

    def __init__(self, support: ToolSupport, user: str | None) -> None:
        self._support = support
        self._user = user
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def _started(self) -> ClientSession:
        async with self._lock:
            if self._session is not None and self._holder is not None and not self._holder.done():
                return self._session
            self._stop = asyncio.Event()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._holder = asyncio.create_task(self._hold(ready))
            self._session = await asyncio.shield(ready)
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            await ensure_browser(self._support)
            server = StdioServerParameters(command=self._support.exe, args=[BROWSER_MCP_COMMAND])
            async with (
                sandbox_mcp_client(
                    self._support, server, user=self._user, request_timeout=CALL_TIMEOUT
                ) as (read, write),
                ClientSession(
                    read, write, read_timeout_seconds=timedelta(seconds=CALL_TIMEOUT)
                ) as session,
            ):
                await asyncio.wait_for(session.initialize(), START_TIMEOUT)
                ready.set_result(session)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("the browser server of a sandbox ended: %s", exc)

    async def call(self, name: str, arguments: dict[str, Any], text_limit: int) -> Relayed:
        try:
            session = await self._started()
        except (RuntimeTransportError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await self.close()
            raise RuntimeTransportError(
                f"{name}: the browser in this sandbox did not start ({_said(exc)}); the next "
                "browser call tries again"
            ) from None
        try:
            result = await session.call_tool(
                name, arguments, read_timeout_seconds=timedelta(seconds=CALL_TIMEOUT)
            )
        except Exception as exc:
            await self.close()  # the next call starts a new server
            raise RuntimeTransportError(
                f"{name}: the browser in this sandbox stopped answering ({type(exc).__name__}); "
                "the next browser call starts it again, on a blank page"
            ) from None
        return relayed(result, text_limit)

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """End the browser's server (its session closed, then its process), `timeout`
        seconds at most before the task holding it is cancelled."""
        holder, self._holder, self._session = self._holder, None, None
        self._stop.set()
        if holder is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(holder), timeout)
            if not holder.done():
                holder.cancel()
                await asyncio.wait({holder}, timeout=CLOSE_TIMEOUT)


def _said(exc: BaseException) -> str:
    """An exception as one short phrase (a group: its first member)."""
    members = getattr(exc, "exceptions", None)  # an exception group (3.10: anyio's)
    while isinstance(members, tuple | list) and members:
        exc = members[0]
        members = getattr(exc, "exceptions", None)
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return f"{type(exc).__name__}: {str(exc)[:300]}" if str(exc) else type(exc).__name__


def relayed(result: types.CallToolResult, text_limit: int) -> Relayed:
    """A browser result as the gateway passes it on: text parts joined and cut to
    `text_limit` (the caller cuts at a line and makes it printable), images kept only
    if each is base64 of a PNG within MAX_SCREENSHOT_BYTES."""
    texts: list[str] = []
    images: list[str] = []
    for part in result.content[:16]:
        if isinstance(part, types.TextContent):
            texts.append(part.text[: text_limit + 1])
        elif isinstance(part, types.ImageContent) and len(images) < MAX_IMAGES:
            images.append(_png(part))
        else:
            texts.append(f"[a {part.type} part, not passed on]")
    return Relayed("\n".join(texts), tuple(images), bool(result.isError))


def _png(part: types.ImageContent) -> str:
    if part.mimeType != "image/png" or len(part.data) > (MAX_SCREENSHOT_BYTES + 2) // 3 * 4:
        raise RuntimeTransportError("the browser sent an image that is not a PNG within 16 MiB")
    try:
        decoded = base64.b64decode(part.data, validate=True)
    except (binascii.Error, ValueError):
        raise RuntimeTransportError("the browser sent an image that is not base64") from None
    if len(decoded) < 24 or not decoded.startswith(PNG_SIGNATURE) or decoded[12:16] != b"IHDR":
        raise RuntimeTransportError("the browser sent an image that is not a PNG")
    width, height = struct.unpack(">II", decoded[16:24])
    if not (0 < width <= MAX_IMAGE_SIDE and 0 < height <= MAX_IMAGE_SIDE):
        raise RuntimeTransportError(
            f"the browser sent a {width}x{height} image, larger than a screenshot is "
            f"({MAX_IMAGE_SIDE} pixels a side at most): not passed on"
        )
    return part.data
