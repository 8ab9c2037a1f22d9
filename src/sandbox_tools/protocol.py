"""Wire constants shared by the runtime and the host (standard library only).

Both sides import this module, so it must never import anything else from the
package: the runtime is frozen on its own and the host must agree with it byte
for byte on codes and framing.
"""

from __future__ import annotations

from collections.abc import Mapping
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

# CLI <-> server framing: one JSON document per line, UTF-8, "\n" terminated.
# json.dumps never emits a raw newline, and a newline outside a JSON string is
# plain whitespace, so a C client may turn any request into a frame by replacing
# "\n" with " " and appending one "\n".
FRAME_TERMINATOR = b"\n"
# Upper bound for one frame; the runtime caps its own responses well below this.
MAX_FRAME_BYTES = 64 * 1024 * 1024

SOCKET_NAME = "server.sock"
SERVER_DIR_ENV = "SANDBOX_TOOLS_DIR"
