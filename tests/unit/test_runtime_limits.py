"""The runtime's limits and bounds under an adversarial caller, on real processes.

The agent may run as the runtime's own uid and call any method (THREAT_MODEL.md, "who is
who"); these tests drive the real controllers (real shells, jobs and MCP server
processes), many calls at once, as the server's per-request tasks do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox_tools import protocol
from sandbox_tools.protocol import INVALID_PARAMS
from sandbox_tools.runtime import server
from sandbox_tools.runtime.host_messages import HostMessages
from sandbox_tools.runtime.jsonrpc import Method, ToolError, dispatch
from sandbox_tools.runtime.limits import DEFAULT_BROWSER, Limits, LimitsError, caller_response_limit
from sandbox_tools.runtime.methods import Controllers
from sandbox_tools.runtime.paths import ServerPaths
from sandbox_tools.runtime.tools.bash_session import json_rpc_methods as bash_methods
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.exec_remote import json_rpc_methods as exec_methods
from sandbox_tools.runtime.tools.exec_remote.controller import ExecRemoteController
from sandbox_tools.runtime.tools.mcp import json_rpc_methods as mcp_methods
from sandbox_tools.runtime.tools.mcp.controller import McpController
from sandbox_tools.runtime.tools.text_editor.controller import TextEditorController
from sandbox_tools.runtime.tools.text_editor.tool_types import TextEditorParams
from tests.support import BAD_ENVS, request

pytestmark = pytest.mark.timeout(180)


# -- S3-7: a limit is checked and reserved in one step -------------------------------------


# -- S3-9: stdin calls are bounded in time ------------------------------------------------


# -- S3-13: environments are checked where params are read ---------------------------------


def method_table() -> dict[str, Method]:
    return {
        **exec_methods.methods(ExecRemoteController()),
        **bash_methods.methods(BashSessionController()),
        **mcp_methods.methods(McpController(HostMessages())),
    }


@pytest.mark.security
@pytest.mark.parametrize(("env", "named"), BAD_ENVS)
@pytest.mark.parametrize("method", ["exec_remote_start", "mcp_launch_server"])
async def test_a_bad_environment_is_invalid_params_naming_the_key(
    method: str, env: dict[str, str], named: str
) -> None:
    """THREAT_MODEL.md, "everything read ... is parsed strictly" (and typed errors, never
    a traceback): an env name like `A=B`, or one holding NUL, once reached execve and
    came back as -32098 with the server's traceback in `data`."""
    params: dict[str, Any] = (
        {"command": "true", "env": env}
        if method == "exec_remote_start"
        else {"server_params": {"command": "cat", "env": env}}
    )
    response = await dispatch(method_table(), request(method, params))
    assert response is not None
    error = response["error"]
    assert error["code"] == INVALID_PARAMS, error
    assert "data" not in error
    assert "env" in error["message"]
    assert named in error["message"]


# -- the limits are read once, at server start, and handed to every controller -------------


def test_an_empty_environment_gives_the_documented_limits() -> None:
    """CONFIGURATION.md, "Runtime limits": each variable's row shows its default."""
    limits = Limits.from_environ({})
    assert limits == Limits()
    text = (Path(__file__).parents[2] / "docs" / "CONFIGURATION.md").read_text()
    rows = text.split("## Runtime limits", 1)[1].split("\n## ", 1)[0].splitlines()
    documented = {
        protocol.EXEC_BUFFER_BYTES_ENV: ("8 MiB", limits.exec_buffer_bytes == 8 << 20),
        protocol.EXEC_RESPONSE_BYTES_ENV: ("2 MiB", limits.exec_response_bytes == 2 << 20),
        protocol.KILL_GRACE_ENV: ("2 s", limits.kill_grace_s == 2.0),
        protocol.STDIN_TIMEOUT_ENV: ("30 s", limits.stdin_timeout_s == 30.0),
        protocol.MAX_JOBS_ENV: ("32", limits.max_jobs == 32),
        protocol.TEXT_EDITOR_MAX_BYTES_ENV: ("48 MiB", limits.text_editor_max_bytes == 48 << 20),
        protocol.MAX_SESSIONS_ENV: ("16", limits.max_sessions == 16),
        protocol.MAX_MCP_SESSIONS_ENV: ("16", limits.max_mcp_sessions == 16),
    }
    for name, (shown, default) in documented.items():
        row = next(line for line in rows if line.endswith(f"| `{name}` |"))
        assert f"| {shown}" in row and default, (name, row)


def test_every_variable_sets_its_limit() -> None:
    environ = {
        protocol.EXEC_BUFFER_BYTES_ENV: "1000",
        protocol.EXEC_RESPONSE_BYTES_ENV: "1e3",
        protocol.KILL_GRACE_ENV: "0.5",
        protocol.STDIN_TIMEOUT_ENV: "3",
        protocol.MAX_JOBS_ENV: "5.9",
        protocol.TEXT_EDITOR_MAX_BYTES_ENV: "4096",
        protocol.MAX_SESSIONS_ENV: "2",
        protocol.MAX_MCP_SESSIONS_ENV: " 7 ",
    }
    assert Limits.from_environ(environ) == Limits(
        exec_buffer_bytes=1000,
        exec_response_bytes=1000,
        kill_grace_s=0.5,
        stdin_timeout_s=3.0,
        max_jobs=5,
        text_editor_max_bytes=4096,
        max_sessions=2,
        max_mcp_sessions=7,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (protocol.EXEC_BUFFER_BYTES_ENV, "lots"),
        (protocol.KILL_GRACE_ENV, "soon"),
        (protocol.STDIN_TIMEOUT_ENV, ""),
        (protocol.MAX_JOBS_ENV, "3 jobs"),
        (protocol.TEXT_EDITOR_MAX_BYTES_ENV, "1.5"),
        (protocol.TEXT_EDITOR_MAX_BYTES_ENV, "-1"),
        (protocol.MAX_SESSIONS_ENV, " 4"),
    ],
)
def test_a_bad_value_falls_back_to_the_default_as_it_always_did(name: str, value: str) -> None:
    """These variables never kept the server from starting: a value that is not a number
    of their kind was ignored, and still is."""
    assert Limits.from_environ({name: value}) == Limits()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (protocol.MAX_MCP_SESSIONS_ENV, "many"),
        (protocol.MAX_MCP_SESSIONS_ENV, ""),
        (protocol.EXEC_BUFFER_BYTES_ENV, "inf"),
        (protocol.MAX_JOBS_ENV, "nan"),
        (protocol.MAX_SESSIONS_ENV, "\u00b2"),  # a digit to str.isdigit, not to int()
    ],
)
def test_a_value_no_limit_can_be_made_of_is_a_clear_error(name: str, value: str) -> None:
    """These values ended the server with a traceback; now a LimitsError names the variable."""
    with pytest.raises(LimitsError, match=f"^{name}={value!r} is not a usable limit"):
        Limits.from_environ({name: value})


@pytest.mark.parametrize(
    ("value", "limit"),
    [
        ("1000", 1000),
        ("007", 7),
        ("0", 0),
        ("", None),
        ("12a", None),
        ("-5", None),
        ("9" * 18, int("9" * 18)),
        ("9" * 19, None),
        ("\u00b2", None),
    ],
)
def test_an_exec_callers_response_limit(value: str, limit: int | None) -> None:
    """Read by each `exec` from its own caller's environment, not by the server."""
    assert caller_response_limit({protocol.RESPONSE_MAX_BYTES_ENV: value}) == limit


def test_the_environment_reaches_the_server_through_limits_from_environ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """run_server reads the limits once, before it serves, and hands them to the server;
    a value it cannot use is a sentence in the log and exit status 1, not a traceback."""
    handed: list[Limits] = []

    class Recording:
        def __init__(self, paths: ServerPaths, limits: Limits) -> None:
            handed.append(limits)

        async def serve(self) -> None:
            return None

    monkeypatch.setattr(server, "RuntimeServer", Recording)
    monkeypatch.setattr(server, "protect_from_oom", lambda: None)
    paths = ServerPaths("/nonexistent")
    monkeypatch.setenv(protocol.MAX_JOBS_ENV, "3")
    monkeypatch.setenv(protocol.MAX_SESSIONS_ENV, "2")
    assert server.run_server(paths) == 0
    assert handed == [Limits(max_jobs=3, max_sessions=2)]
    monkeypatch.setenv(protocol.MAX_MCP_SESSIONS_ENV, "many")
    assert server.run_server(paths) == 1
    assert len(handed) == 1
    logged = capsys.readouterr().err
    assert f"cannot start: {protocol.MAX_MCP_SESSIONS_ENV}='many' is not a usable" in logged
    assert "Traceback" not in logged


async def test_the_server_hands_one_limits_object_to_every_controller() -> None:
    limits = Limits(max_jobs=1, max_sessions=1, max_mcp_sessions=1)
    controllers = Controllers(limits)
    try:
        assert controllers.exec_remote.limits is limits
        assert controllers.bash_session.limits is limits
        assert controllers.text_editor.limits is limits
        assert controllers.mcp.limits is limits
    finally:
        await controllers.shutdown()


async def test_text_editor_refuses_a_file_past_its_limit(tmp_path: Path) -> None:
    controller = TextEditorController(Limits(text_editor_max_bytes=10))
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_text("0123456789")
    large.write_text("0123456789a")
    shown = await controller.run(TextEditorParams.parse({"command": "view", "path": str(small)}))
    assert "0123456789" in shown
    with pytest.raises(ToolError, match=r"11 bytes, more than text_editor handles \(10\)"):
        await controller.run(TextEditorParams.parse({"command": "view", "path": str(large)}))


def test_the_installed_add_on_comes_before_the_images_browser_variable(tmp_path: Path) -> None:
    """THREAT_MODEL.md rule 2: the runtime's environment is partly the image's, so the
    browser the host installed and verified wins over SANDBOX_TOOLS_BROWSER."""
    launcher = tmp_path / "sandbox-tools"
    chosen = Limits.from_environ(
        {"SANDBOX_TOOLS_BROWSER": "/bin/false", "SANDBOX_TOOLS_SELF": str(launcher)}
    )
    assert chosen.browser_executable() == "/bin/false"  # no add-on yet
    (tmp_path / "browser").mkdir()
    (tmp_path / "browser" / "chrome").write_bytes(b"")
    assert chosen.browser_executable() == str(tmp_path / "browser" / "chrome")
    assert Limits().browser_executable() == DEFAULT_BROWSER
