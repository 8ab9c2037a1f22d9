"""The gateway's owner label and its refusal of a project file, with real processes (no
container): a gone gateway told from a live one by pid and start time, and `tools mcp`
started in a repository whose pyproject.toml would stop any other command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from sandbox_tools.mcp_gateway.owner import Owner, gateway_owner, owner_state
from tests.support import SRC, RawMcpServer


def test_an_owner_label_tells_a_live_gateway_from_a_gone_one() -> None:
    assert owner_state(gateway_owner()) is Owner.ALIVE
    host, boot, namespace, _pid, _start = gateway_owner().split("/")
    here = f"{host}/{boot}/{namespace}"
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert owner_state(f"{here}/{gone}/1") is Owner.GONE
    pid = os.getpid()
    assert owner_state(f"{here}/{pid}/1") is Owner.GONE  # this pid, but a later process
    assert owner_state(f"another-host/{boot}/{namespace}/{pid}/1") is Owner.ELSEWHERE
    # Another pid namespace (a gateway in a container with this host's name), or another
    # machine with this host's name sharing the engine (another boot id): never gone.
    assert owner_state(f"{host}/{boot}/4026531999/{gone}/1") is Owner.ELSEWHERE
    assert owner_state(f"{host}/{'0' * 8}-0000/{namespace}/{gone}/1") is Owner.ELSEWHERE
    assert owner_state("garbage") is Owner.ELSEWHERE
    assert socket.gethostname() == host


def test_tools_mcp_reads_no_project_file(tmp_path: Path) -> None:
    """A repository's pyproject.toml whose table would stop any other command (an
    unknown key) does not reach `tools mcp`: it answers initialize and lists its tools."""
    (tmp_path / "pyproject.toml").write_text("[tool.sandbox-tools]\nno-such-key = 1\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    refused = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", "cleanup", "--mcp"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "no-such-key" in refused.stderr
    server = RawMcpServer(env, tmp_path / "stderr.log", cwd=tmp_path)  # initialize answered
    try:
        server.send({"id": 2, "method": "tools/list"})
        listed = server.answer()
        assert server.close() == 0
    finally:
        server.end()
    assert listed["id"] == 2
    assert "sandbox_create" in {tool["name"] for tool in listed["result"]["tools"]}


def test_a_lone_surrogate_in_a_request_is_answered_not_left_waiting(tmp_path: Path) -> None:
    """JSON can escape a lone surrogate, which no text holds; the SDK answered such a
    request with an error without its id, and the client waited until its timeout."""
    env = {**os.environ, "PYTHONPATH": SRC}
    server = RawMcpServer(env, tmp_path / "stderr.log", cwd=tmp_path)
    try:
        # json.dumps escapes it ("\\ud800"), as a client's JSON encoder may
        server.call(2, "bash", sandbox="sbx-\ud800", input="ls\n")
        answered = server.answer()
        assert server.close() == 0
    finally:
        server.end()
    assert answered["id"] == 2, answered
    result = answered["result"]
    assert result["isError"] and "there is no sandbox 'sbx-\ufffd'" in result["content"][0]["text"]
