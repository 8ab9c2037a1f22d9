"""Host side: put the runtime into a sandbox, then talk to it."""

from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecEvent,
    ExecRemoteOptions,
    ExecRemoteProcess,
    ExecResult,
    StderrChunk,
    StdoutChunk,
    exec_remote,
)
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    RuntimeClient,
    StdioRuntimeClient,
    connect_runtime,
)
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor

__all__ = [
    "Completed",
    "ExecEvent",
    "ExecRemoteOptions",
    "ExecRemoteProcess",
    "ExecResult",
    "ExecRuntimeClient",
    "RuntimeClient",
    "StderrChunk",
    "StdioRuntimeClient",
    "StdoutChunk",
    "bash_session",
    "connect_runtime",
    "exec_remote",
    "new_bash_session",
    "text_editor",
]
