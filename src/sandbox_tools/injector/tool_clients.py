"""Typed async clients for the model-facing tools: bash_session and text_editor.

Tool failures (-32099) raise `ToolError` carrying the runtime's sentence, meant for
the model; transport failures raise `RuntimeTransportError`, meant for the harness.
"""

from __future__ import annotations

from typing import Any

from sandbox_tools.errors import RuntimeTransportError, ToolError
from sandbox_tools.injector.jsonrpc_client import RuntimeClient, result_fields
from sandbox_tools.protocol import ErrorReason, User
from sandbox_tools.runtime.tools.bash_session.tool_types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    InteractParams,
    NewSessionParams,
)
from sandbox_tools.runtime.tools.text_editor.tool_types import Command as TextEditorCommand
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams


async def start_bash_session(client: RuntimeClient, user: User | None = None) -> tuple[str, str]:
    """Start an interactive shell: its session name (never given twice) and
    the runtime's note for whoever reads the output ("" or, e.g., that an image without
    bash got `sh -i`, so the model should not expect bash syntax)."""
    params = NewSessionParams(user=None).to_params(user=user)
    result = await client.call("bash_session_new_session", params)
    name = result_fields(result, "bash_session_new_session", session_name=str)["session_name"]
    note = result.get("note") if isinstance(result, dict) else None
    return str(name), note if isinstance(note, str) else ""


def session_gone(error: ToolError) -> bool:
    """Whether a bash_session call failed because its session no longer exists (closed,
    reclaimed, or held by a server that was restarted since)."""
    return error.reason is ErrorReason.SESSION_GONE


async def close_bash_session(client: RuntimeClient, session_name: str) -> bool:
    """End a session (its shell and what runs in it); False if it was gone already."""
    result = await client.call("bash_session_close_session", {"session_name": session_name})
    return bool(result_fields(result, "bash_session_close_session", closed=bool)["closed"])


async def new_bash_session(client: RuntimeClient, user: User | None = None) -> str:
    """Start an interactive shell; returns its session name."""
    return (await start_bash_session(client, user))[0]


async def bash_session(
    client: RuntimeClient,
    session_name: str,
    input: str | None = None,
    *,
    wait_for_output: float = 30,
    idle_timeout: float = 0.5,
    max_output_bytes: int | None = None,
    restart: bool = False,
) -> str:
    """Send `input` (verbatim: end a command with "\\n") and return the terminal output."""
    params = InteractParams(
        session_name=session_name,
        input=None if restart else input,
        restart=restart,
        wait_for_output=wait_for_output,
        idle_timeout=idle_timeout,
        max_output_bytes=max_output_bytes or DEFAULT_MAX_OUTPUT_BYTES,
    ).to_params()
    # The runtime answers within wait_for_output; allow generous slack for the transport.
    return _text(
        await client.call("bash_session", params, timeout=wait_for_output + 60), "bash_session"
    )


def _text(result: Any, method: str) -> str:
    if not isinstance(result, str):
        raise RuntimeTransportError(f"{method}: expected text as the result, got {result!r:.200}")
    return result


async def text_editor(
    client: RuntimeClient,
    command: TextEditorCommand,
    path: str,
    *,
    view_range: tuple[int, int] | None = None,
    file_text: str | None = None,
    old_str: str | None = None,
    new_str: str | None = None,
    insert_line: int | None = None,
    user: User | None = None,
) -> str:
    """Run one text_editor command on `path` in the sandbox; the runtime's text answer.

    view: the file with line numbers (or a directory listing), `view_range` to narrow it;
    create: write `file_text` as a new file; str_replace: `old_str` must occur exactly
    once; insert: `new_str` after line `insert_line` (0: at the top); undo_edit: the file
    as it was before the last edit made through the runtime. `user` acts as that identity.
    An expected failure (no such file, ambiguous old_str) raises ToolError with the
    sentence to show the model.
    """
    params = TextEditorParams(
        command=command,
        path=path,
        view_range=view_range,
        file_text=file_text,
        old_str=old_str,
        new_str=new_str,
        insert_line=insert_line,
        user=None,
    ).to_params(user=user)
    return _text(await client.call("text_editor", params), "text_editor")
