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
    "connect_runtime",
    "exec_remote",
]
