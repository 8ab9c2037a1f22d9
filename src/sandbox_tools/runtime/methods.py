"""The server's method table: core methods plus one module per tool."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from sandbox_tools.runtime.build_info import build_info
from sandbox_tools.runtime.host_messages import HostMessages
from sandbox_tools.runtime.jsonrpc import Method, MethodTable
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.tools.bash_session import json_rpc_methods as bash_session_methods
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.exec_remote import json_rpc_methods as exec_remote_methods
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
from sandbox_tools.runtime.tools.http_tunnel.controller import HttpTunnelController
from sandbox_tools.runtime.tools.mcp import json_rpc_methods as mcp_methods
from sandbox_tools.runtime.tools.mcp.controller import McpController
from sandbox_tools.runtime.tools.text_editor import json_rpc_methods as text_editor_methods
from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController
from sandbox_tools.runtime.tools.web_browser import json_rpc_methods as web_browser_methods
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController


def core_methods(
    server_dir: str, request_shutdown: Callable[[], None], limits: Limits
) -> dict[str, Method]:
    rpc = MethodTable()

    @rpc.method
    async def version() -> Any:
        return build_info()["version"]

    @rpc.method
    async def remote_version() -> Any:
        return f"Server: {sys.argv[0]} ({os.getpid()})"

    @rpc.method
    async def runtime_info() -> Any:
        # The limits this server holds (read once, when it started): a host reusing a
        # server started with other values sees which ones apply.
        return {
            **build_info(),
            "pid": os.getpid(),
            "server_dir": server_dir,
            "limits": limits.reported(),
        }

    @rpc.method
    async def sandbox_tools_shutdown() -> Any:
        request_shutdown()
        return None

    return rpc.methods


class Controllers:
    """The server's state: one controller per tool, each bounded by the same `limits`
    (read once, when the server started)."""

    def __init__(
        self,
        limits: Limits,
        lost_jobs_note: str | None = None,
        state_directory: str | None = None,
    ) -> None:
        self.limits = limits
        self.exec_remote = ExecRemoteController(limits, lost_jobs_note=lost_jobs_note)
        self.bash_session = BashSessionController(limits)
        self.text_editor = TextEditorController(limits)
        self.host_messages = HostMessages()
        self.mcp = McpController(self.host_messages, limits)
        self.http_tunnel = HttpTunnelController(self.host_messages)
        self.web_browser = WebBrowserController(limits, state_directory=state_directory)

    async def shutdown(self) -> None:
        self.host_messages.stop()
        await self.mcp.shutdown()
        await self.exec_remote.shutdown()
        await self.bash_session.shutdown()
        await self.web_browser.shutdown()


def all_methods(
    server_dir: str, request_shutdown: Callable[[], None], controllers: Controllers
) -> dict[str, Method]:
    """Every method the server serves, in one table: a name two tools both register is
    refused when the server starts rather than one silently shadowing the other."""
    table = MethodTable()
    for methods in (
        core_methods(server_dir, request_shutdown, controllers.limits),
        exec_remote_methods.methods(controllers.exec_remote),
        bash_session_methods.methods(controllers.bash_session),
        text_editor_methods.methods(controllers.text_editor),
        mcp_methods.methods(controllers.mcp),
        controllers.host_messages.methods(),
        controllers.http_tunnel.methods(),
        web_browser_methods.methods(controllers.web_browser),
    ):
        table.extend(methods)
    return table.methods
