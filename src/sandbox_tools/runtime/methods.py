"""The server's method table: the core methods, and each tool's, loaded on its first call.

Importing every tool (and what each imports: the browser's CDP client, the MCP bridge)
and making its controller was a third of a fresh server's start, and a sample calls one
or two tools. So the server starts with the core methods only; a tool is imported, and
its controller made, when a method of its prefix is first called (`TOOLS`). Every name a
tool serves starts with one of its prefixes, and no two tools share a prefix (both
checked when a tool loads, and by a test over all of them), so the table answers every
name exactly as one built whole would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sandbox_tools.protocol import INTERNAL_ERROR
from sandbox_tools.runtime.build_info import build_info
from sandbox_tools.runtime.host_messages import HostMessages
from sandbox_tools.runtime.jsonrpc import Method, MethodTable, Params, RpcError
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.paths import BROWSER_PROFILES_FILE
from sandbox_tools.runtime.tools.http_tunnel.controller import HttpTunnelController

if TYPE_CHECKING:
    from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
    from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
    from sandbox_tools.runtime.tools.mcp.controller import McpController
    from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController
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


Loaded = tuple[Any, dict[str, Method]]  # a tool's controller, and its methods


def _exec_remote(controllers: Controllers) -> Loaded:
    from sandbox_tools.runtime.tools.exec_remote import json_rpc_methods
    from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController

    controller = ExecRemoteController(controllers.limits, controllers.lost_jobs_note)
    return controller, json_rpc_methods.methods(controller)


def _bash_session(controllers: Controllers) -> Loaded:
    from sandbox_tools.runtime.tools.bash_session import json_rpc_methods
    from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController

    controller = BashSessionController(controllers.limits)
    return controller, json_rpc_methods.methods(controller)


def _text_editor(controllers: Controllers) -> Loaded:
    from sandbox_tools.runtime.tools.text_editor import json_rpc_methods
    from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController

    controller = TextEditorController(controllers.limits)
    return controller, json_rpc_methods.methods(controller)


def _mcp(controllers: Controllers) -> Loaded:
    from sandbox_tools.runtime.tools.mcp import json_rpc_methods
    from sandbox_tools.runtime.tools.mcp.controller import McpController

    controller = McpController(controllers.host_messages, controllers.limits)
    return controller, json_rpc_methods.methods(controller)


def _web_browser(controllers: Controllers) -> Loaded:
    from sandbox_tools.runtime.tools.web_browser import json_rpc_methods
    from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController

    controller = WebBrowserController(
        controllers.limits, state_directory=controllers.state_directory
    )
    return controller, json_rpc_methods.methods(controller)


def _desktop(controllers: Controllers) -> Loaded:
    from sandbox_tools.runtime.tools.desktop import json_rpc_methods
    from sandbox_tools.runtime.tools.desktop.controller import DesktopController

    controller = DesktopController(controllers.limits)
    return controller, json_rpc_methods.methods(controller)


@dataclass(frozen=True)
class Tool:
    """A tool of the server: the prefixes of the method names it serves, and how it is
    imported and its controller made."""

    prefixes: tuple[str, ...]
    load: Callable[[Controllers], Loaded]


# In the order their controllers shut down.
TOOLS: dict[str, Tool] = {
    "mcp": Tool(("mcp_",), _mcp),
    "exec_remote": Tool(("exec_remote_",), _exec_remote),
    "bash_session": Tool(("bash_session",), _bash_session),
    "web_browser": Tool(("web_", "browser_"), _web_browser),
    "desktop": Tool(("computer_",), _desktop),
    "text_editor": Tool(("text_editor",), _text_editor),
}


def tool_of(method: str) -> str | None:
    """The tool whose prefix `method` has, if any."""
    return next((name for name, tool in TOOLS.items() if method.startswith(tool.prefixes)), None)


class Controllers:
    """The server's state: one controller per tool, each bounded by the same `limits`
    (read once, when the server started), made when the tool is first called. The
    sandbox -> host message queue and the HTTP tunnel, which the host uses from the
    start, are made at once."""

    def __init__(
        self,
        limits: Limits,
        lost_jobs_note: str | None = None,
        state_directory: str | None = None,
    ) -> None:
        self.limits = limits
        self.lost_jobs_note = lost_jobs_note
        self.state_directory = state_directory
        self.host_messages = HostMessages()
        self.http_tunnel = HttpTunnelController(self.host_messages)
        self.methods: dict[str, Method] = {}  # of the tools loaded so far
        self._loaded: dict[str, Any] = {}
        if state_directory and os.path.exists(os.path.join(state_directory, BROWSER_PROFILES_FILE)):
            # A server killed with browsers open left profiles to remove: at once, as
            # a server that made every controller at its start did, not at a first call.
            self.load("web_browser")

    def load(self, tool: str) -> Any:
        """The tool's controller, imported and made on the first call. ValueError if the
        tool serves a name outside its prefixes or one already served."""
        controller = self._loaded.get(tool)
        if controller is not None:
            return controller
        spec = TOOLS[tool]
        controller, methods = spec.load(self)
        for name in methods:
            if not name.startswith(spec.prefixes):
                raise ValueError(f"the tool {tool} serves {name!r}, outside its prefixes")
            if name in self.methods:
                raise ValueError(f"the method {name!r} is registered twice")
        self.methods.update(methods)
        self._loaded[tool] = controller
        return controller

    def loaded(self, tool: str) -> bool:
        return tool in self._loaded

    def load_all(self) -> None:
        for tool in TOOLS:
            self.load(tool)

    @property
    def exec_remote(self) -> ExecRemoteController:
        return cast("ExecRemoteController", self.load("exec_remote"))

    @property
    def bash_session(self) -> BashSessionController:
        return cast("BashSessionController", self.load("bash_session"))

    @property
    def text_editor(self) -> TextEditorController:
        return cast("TextEditorController", self.load("text_editor"))

    @property
    def mcp(self) -> McpController:
        return cast("McpController", self.load("mcp"))

    @property
    def web_browser(self) -> WebBrowserController:
        return cast("WebBrowserController", self.load("web_browser"))

    async def shutdown(self) -> None:
        self.host_messages.stop()
        for tool in TOOLS:
            controller = self._loaded.get(tool)
            stop = getattr(controller, "shutdown", None)
            if stop is not None:
                await stop()


class ServedMethods(Mapping[str, Method]):
    """Every method the server serves, by name: a tool's are loaded when one of its
    names is first looked up, and iterating loads every tool (the docs' and the tests'
    view of the whole table)."""

    def __init__(self, core: Mapping[str, Method], controllers: Controllers) -> None:
        self._core = dict(core)
        self._controllers = controllers
        for name in core:
            if tool_of(name) is not None:
                raise ValueError(f"the core method {name!r} has a tool's prefix")

    def __getitem__(self, name: str) -> Method:
        method = self._core.get(name) or self._controllers.methods.get(name)
        if method is not None:
            return method
        tool = tool_of(name)
        if tool is None or self._controllers.loaded(tool):
            raise KeyError(name)
        try:
            self._controllers.load(tool)
        except (Exception, SystemExit) as exc:  # answers why, on each of its calls
            # (SystemExit: PyInstaller's importer gives up so when its archive is gone)
            return _failed_to_load(tool, exc)
        return self._controllers.methods[name]  # KeyError: not a name the tool serves

    def __iter__(self) -> Iterator[str]:
        self._controllers.load_all()
        yield from self._core
        yield from self._controllers.methods

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _failed_to_load(tool: str, exc: BaseException) -> Method:
    async def failed(params: Params) -> Any:
        raise RpcError(INTERNAL_ERROR, f"the runtime's {tool} tool could not be loaded: {exc}")

    return failed


def all_methods(
    server_dir: str,
    request_shutdown: Callable[[], None],
    controllers: Controllers,
    extra: Mapping[str, Method] | None = None,
) -> ServedMethods:
    """Every method the server serves, in one table: a name two tools both register is
    refused rather than one silently shadowing the other. `extra`: the server's own."""
    core = MethodTable()
    for methods in (
        core_methods(server_dir, request_shutdown, controllers.limits),
        controllers.host_messages.methods(),
        controllers.http_tunnel.methods(),
        extra or {},
    ):
        core.extend(methods)
    return ServedMethods(core.methods, controllers)
