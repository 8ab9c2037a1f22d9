"""inspect_ai integration (optional extra `[inspect]`).

- `bash_session()`, `text_editor()`, `exec_remote()`, `mcp_server_sandbox()`: inspect's
  tools, exec_remote and sandbox MCP servers, same parameters and events, backed by our
  runtime injected into any inspect sandbox.
- `computer()`: inspect's computer tool on an X desktop the runtime starts from its
  desktop add-on (delivered on first use), in any image.
- `web_browser()`: inspect's web browser tools on a headless Chromium the runtime runs in
  the sandbox (delivered on first use); `browser_mcp_server()`: the same browser as an
  MCP server for `mcp_tools()`.
- `docker_sdk` and `modal` sandbox environments, registered with inspect_ai through the
  package's `inspect_ai` entry point (`--sandbox docker_sdk`, `--sandbox modal`).
- `adapter.InspectSandbox`: any inspect_ai sandbox environment as our provider.
"""

from sandbox_tools.inspect.browser import browser_mcp_server, web_browser
from sandbox_tools.inspect.computer import computer
from sandbox_tools.inspect.docker_env import DockerSdkConfig
from sandbox_tools.inspect.tools import (
    ExecRemoteProcess,
    bash_session,
    exec_remote,
    mcp_server_sandbox,
    text_editor,
)

__all__ = [
    "DockerSdkConfig",
    "ExecRemoteProcess",
    "bash_session",
    "browser_mcp_server",
    "computer",
    "exec_remote",
    "mcp_server_sandbox",
    "text_editor",
    "web_browser",
]
