"""Wire constants shared by the runtime and the host (standard library only).

Both sides import this module, so it must never import anything else from the
package: the runtime is frozen on its own and the host must agree with it byte
for byte on codes and framing.
"""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

JSONRPC_VERSION = "2.0"

# `user` on the wire (PROTOCOL.md "Identities"): a name, "uid" / "uid:gid", or an
# identity object {"uid", "gid", "groups", "home"} as inspect_ai sends it.
User: TypeAlias = "str | Mapping[str, Any]"

# Error codes (PROTOCOL.md, "Errors").
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
TOOL_ERROR = -32099
INTERNAL_ERROR = -32098
CONTINUATION_UNKNOWN = -32000


class ErrorReason(str, enum.Enum):
    """Why a tool failed (-32099), for the host's logic: `error.data.reason` on the wire
    (PROTOCOL.md, "Errors"). The message is for the model; a host decides on this, never
    on the message's words. A reason the host does not know reads as none."""

    SESSION_GONE = "session_gone"
    PROCESS_GONE = "process_gone"
    TOO_MANY = "too_many"
    BROWSER_FAILED = "browser_failed"


# What each reason means: PROTOCOL.md's table is generated from this one.
ERROR_REASONS: dict[ErrorReason, str] = {
    ErrorReason.SESSION_GONE: "the session (bash, browser, MCP) does not exist here: never "
    "made, closed, reclaimed to make room, or held by a server restarted since; a new one "
    "can be made",
    ErrorReason.PROCESS_GONE: "the `exec_remote` process is unknown: its result was collected "
    "long ago, or it was lost with a server that ended",
    ErrorReason.TOO_MANY: "a limit of the runtime is reached (sessions, processes): end some first",
    ErrorReason.BROWSER_FAILED: "the browser crashed, hung or broke the protocol; it was "
    "stopped and the next call starts a fresh one",
}


# CLI <-> server framing: one JSON document per line, UTF-8, "\n" terminated.
# json.dumps never emits a raw newline, and a newline outside a JSON string is
# plain whitespace, so a C client may turn any request into a frame by replacing
# "\n" with " " and appending one "\n".
FRAME_TERMINATOR = b"\n"
# Upper bound for one frame; the runtime caps its own responses well below this.
MAX_FRAME_BYTES = 64 * 1024 * 1024

# inspect_ai's large-response exchange (PROTOCOL.md "Large responses"): a client whose
# exec output is capped sets this variable on `exec`; a response that would not fit is
# held by the server and fetched in pieces with the continuation method.
RESPONSE_MAX_BYTES_ENV = "INSPECT_SANDBOX_JSON_RPC_RESPONSE_MAX_BYTES"
RESPONSE_CHUNK_METHOD = "__inspect_json_rpc_response_chunk__"
RESPONSE_CHUNK_FIELD = "__inspect_json_rpc_response_chunk__"
RESPONSE_CHUNK_VERSION = 1
# CLI -> server only: a line before the request carrying the caller's limit. It starts
# with "#" so it can never be mistaken for a JSON-RPC frame.
RESPONSE_LIMIT_OPTION = b"#max-response-bytes "
# CLI -> server only: a line before the requests naming the caller's working directory.
# A job or shell started without `cwd` starts there (the sandbox's working directory for
# that call), never where the server happened to start.
CWD_OPTION = b"#cwd "


def cwd_option() -> bytes:
    """This process's working directory as a CWD_OPTION line, or b"" if it has none
    that can travel (deleted, or holding a newline)."""
    try:
        cwd = os.fsencode(os.getcwd())
    except OSError:
        return b""
    if b"\n" in cwd or b"\r" in cwd or len(cwd) > 4096:
        return b""
    return CWD_OPTION + cwd + b"\n"


# JSON from a sandbox costs far more as Python objects than as bytes (`[{},{},...]`: about
# 24 times): a frame is refused before it is parsed when it may hold more values than
# this, and what is kept is counted at VALUE_COST bytes a value on top of its length.
MAX_JSON_VALUES = 1_000_000
VALUE_COST = 96


# A message an MCP server sends on its own (a request or a notification) holds at most
# this many JSON values. Whole frames may hold MAX_JSON_VALUES, but the host's MCP SDK
# validates such a message into pydantic models that cost far more (a sampling request
# of a million values held about 400 MiB of the host and 7.7 s of its event loop).
# 50,000 values is still 10,000 sampling messages. The runtime drops a bigger one before
# it is queued (a request is answered with an error), and the host checks again.
MAX_SERVER_MESSAGE_VALUES = 50_000


def json_values(text: bytes | str) -> int:
    """An upper bound on the values in a JSON text (every value after a container's first
    follows a comma; commas inside strings only make it larger), counted in C speed."""
    if isinstance(text, str):
        return text.count("{") + text.count("[") + text.count(",") + 1
    return text.count(b"{") + text.count(b"[") + text.count(b",") + 1


def json_cost(text: bytes | str) -> int:
    """What holding `text` parsed may cost, in bytes: its length plus VALUE_COST a value."""
    return len(text) + VALUE_COST * json_values(text)


# Sandbox -> host messages (PROTOCOL.md): the notifications the runtime sends first.
HOST_MESSAGE_MCP = "mcp_server_message"  # {session_id, message}
HOST_MESSAGE_HTTP_REQUEST = "http_request"  # {request_id, method, path, headers, body}
HOST_MESSAGE_HTTP_CANCEL = "http_cancel"  # {request_id, reason}
# The headers of one tunnelled request, at most: what the in-sandbox proxy's 64 KiB head
# can hold. The runtime refuses more, and so does the host (it trusts no runtime).
TUNNEL_MAX_HEADERS = 256
TUNNEL_MAX_HEADER_BYTES = 64 * 1024


def tunnel_headers_too_many(headers: Sequence[Sequence[str]]) -> str | None:
    """Why a tunnelled request's [name, value] headers are refused as too many, if so."""
    if len(headers) > TUNNEL_MAX_HEADERS or sum(map(len, itertools.chain(*headers))) > (
        TUNNEL_MAX_HEADER_BYTES
    ):
        return f"more than {TUNNEL_MAX_HEADERS} headers or {TUNNEL_MAX_HEADER_BYTES} bytes of them"
    return None


# From the `stdio` bridge itself: it lost its server connection, and with it the
# subscription to the messages above; the host subscribes again.
RUNTIME_SERVER_LOST = "runtime_server_lost"  # {reason}
# HTTP headers about one connection, not the message: the model proxy never relays them.
HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)

SOCKET_NAME = "server.sock"

# The runtime's environment variables, named once here: the host sets some of them
# (the injector puts SERVER_DIR_ENV inside its install directory) and the C launcher
# repeats the ones it reads or sets (tests/unit/test_portable_launcher.py checks it).
SERVER_DIR_ENV = "SANDBOX_TOOLS_DIR"
# Exported by the portable launcher: its own path, how the runtime starts itself again.
LAUNCHER_SELF_ENV = "SANDBOX_TOOLS_SELF"
# The runtime server's pid, set for the desktop's programs: the desktop add-on's launcher
# (build_containers/resources/desktop/launcher.c) has the kernel kill a program it
# starts when that process ends, so a killed server leaves no X server behind.
DESKTOP_PARENT_ENV = "SANDBOX_TOOLS_DESKTOP_PARENT"
# The desktop's private directory, set for its X server: the add-on's keymap shim
# (resources/desktop/xkbcomp_shim.c) keeps the compiled keymap there, not at a name in
# /tmp another user could take first.
DESKTOP_KEYMAPS_ENV = "SANDBOX_TOOLS_DESKTOP_KEYMAPS"
# A caller's RESPONSE_MAX_BYTES_ENV travels (as RESPONSE_LIMIT_OPTION) only when it is at
# most this many ASCII digits: it then fits a signed 64-bit integer on both sides.
RESPONSE_LIMIT_MAX_DIGITS = 18

# The runtime's limits (CONFIGURATION.md, "Runtime limits"), read once when the server
# starts (runtime/limits.py) and handed to the tools.
EXEC_BUFFER_BYTES_ENV = "SANDBOX_TOOLS_EXEC_BUFFER_BYTES"
EXEC_RESPONSE_BYTES_ENV = "SANDBOX_TOOLS_EXEC_RESPONSE_BYTES"
KILL_GRACE_ENV = "SANDBOX_TOOLS_KILL_GRACE"
STDIN_TIMEOUT_ENV = "SANDBOX_TOOLS_STDIN_TIMEOUT"
MAX_JOBS_ENV = "SANDBOX_TOOLS_MAX_JOBS"
TEXT_EDITOR_MAX_BYTES_ENV = "SANDBOX_TOOLS_TEXT_EDITOR_MAX_BYTES"
MAX_SESSIONS_ENV = "SANDBOX_TOOLS_MAX_SESSIONS"
MAX_MCP_SESSIONS_ENV = "SANDBOX_TOOLS_MAX_MCP_SESSIONS"
# The web browser tool: the browser it starts (the add-on's launcher, or any Chromium
# headless shell), and its bounds.
BROWSER_ENV = "SANDBOX_TOOLS_BROWSER"
BROWSER_IDLE_TIMEOUT_ENV = "SANDBOX_TOOLS_BROWSER_IDLE_TIMEOUT"
DESKTOP_SETTLE_ENV = "SANDBOX_TOOLS_DESKTOP_SETTLE"
BROWSER_CALL_TIMEOUT_ENV = "SANDBOX_TOOLS_BROWSER_CALL_TIMEOUT"
BROWSER_TREE_MAX_CHARS_ENV = "SANDBOX_TOOLS_BROWSER_TREE_MAX_CHARS"
MAX_BROWSER_SESSIONS_ENV = "SANDBOX_TOOLS_MAX_BROWSER_SESSIONS"
