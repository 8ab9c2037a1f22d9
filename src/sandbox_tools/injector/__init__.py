"""Host side: put the runtime into a sandbox, then talk to it.

The main names, in one place. The MCP transport needs the optional `mcp` package and is
imported from its module: `from sandbox_tools.injector.mcp_client import sandbox_mcp_client`.
"""

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
from sandbox_tools.injector.inject import (
    Injector,
    ToolSupport,
    forget_sandbox,
    open_tool_support,
    prepare_tool_support,
    tool_support_sandbox,
)
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    RuntimeClient,
    StdioRuntimeClient,
    connect_runtime,
)
from sandbox_tools.injector.model_proxy import ModelProxy, ProxyRequest, ProxyResponse, forward_to
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor

__all__ = [
    "Completed",
    "ExecEvent",
    "ExecRemoteOptions",
    "ExecRemoteProcess",
    "ExecResult",
    "ExecRuntimeClient",
    "InjectionOptions",
    "Injector",
    "ModelProxy",
    "ProxyRequest",
    "ProxyResponse",
    "RuntimeClient",
    "StderrChunk",
    "StdioRuntimeClient",
    "StdoutChunk",
    "ToolSupport",
    "bash_session",
    "connect_runtime",
    "exec_remote",
    "forget_sandbox",
    "forward_to",
    "new_bash_session",
    "open_tool_support",
    "prepare_tool_support",
    "text_editor",
    "tool_support_sandbox",
]
