"""A runtime server that outlives its samples (inspect's `local` sandbox, a container
reused across samples): one build per server directory, jobs that start where the call
came from, and sessions reclaimed instead of refused. Real runtime processes from source,
driven through the CLI as a host's `exec` would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import SRC, RuntimeDir


def cli(
    env: dict[str, str], request: dict[str, Any], cwd: str | None = None, src: str = SRC
) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.runtime", "exec", json.dumps(request)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": src},
        cwd=cwd,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    response: dict[str, Any] = json.loads(done.stdout)
    return response


def call(env: dict[str, str], method: str, params: Any = None, **kw: Any) -> Any:
    response = cli(env, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}, **kw)
    assert "result" in response, response
    return response["result"]


@pytest.fixture
def tmpdir_env() -> Iterator[dict[str, str]]:
    """A TMPDIR of its own and no SANDBOX_TOOLS_DIR: the default server directory."""
    base = tempfile.mkdtemp(prefix="st-t", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_TOOLS_DIR"}
    env["TMPDIR"] = base
    yield env
    for server_dir in Path(base).glob("sandbox-tools-*"):
        subprocess.run(
            [sys.executable, "-m", "sandbox_tools.runtime", "stop-server"],
            env={**env, "SANDBOX_TOOLS_DIR": str(server_dir), "PYTHONPATH": SRC},
            capture_output=True,
            timeout=30,
        )
    shutil.rmtree(base, ignore_errors=True)


def test_a_client_never_meets_a_server_of_another_build(
    tmpdir_env: dict[str, str], tmp_path: Path
) -> None:
    """One build, one server: two builds of the runtime (this checkout and a copy of it)
    run by the same uid in the same TMPDIR each start and talk to their own server, in a
    directory keyed by their build; neither answers for the other."""
    other = tmp_path / "other-build"
    shutil.copytree(SRC, other, ignore=shutil.ignore_patterns("__pycache__"))
    ours = call(tmpdir_env, "runtime_info")
    theirs = call(tmpdir_env, "runtime_info", src=str(other))
    assert ours["server_dir"] != theirs["server_dir"]
    assert ours["pid"] != theirs["pid"]
    uid = os.geteuid()
    for info in (ours, theirs):
        name = Path(info["server_dir"]).name
        assert name.startswith(f"sandbox-tools-{uid}-src-"), name
    assert call(tmpdir_env, "runtime_info")["pid"] == ours["pid"]  # and it stays ours


def test_jobs_start_where_the_call_came_from_not_where_the_server_started(
    runtime_dir: RuntimeDir, tmp_path: Path
) -> None:
    """A server started from a sample's temporary directory outlives it: later jobs and
    shells without `cwd` start in their caller's directory, with no getcwd error, and
    the server itself holds no directory that can vanish."""
    env = runtime_dir.env
    first = tmp_path / "sample-1"
    first.mkdir()
    call(env, "version", cwd=str(first))
    shutil.rmtree(first)  # the sample's cleanup
    for n in range(2, 5):
        here = tmp_path / f"sample-{n}"
        here.mkdir()
        job = call(env, "exec_remote_start", {"command": "pwd"}, cwd=str(here))
        deadline = time.monotonic() + 30
        stdout = stderr = ""
        while time.monotonic() < deadline:
            polled = call(env, "exec_remote_poll", {"pid": job["pid"], "wait_ms": 1000})
            stdout, stderr = stdout + polled["stdout"], stderr + polled["stderr"]
            if polled["state"] != "running":
                break
        assert (stdout.strip(), stderr) == (str(here), "")
    pid = runtime_dir.server_pid()
    assert os.readlink(f"/proc/{pid}/cwd") == "/"


def test_sessions_left_open_are_reclaimed_not_refused(runtime_dir: RuntimeDir) -> None:
    """A host that never closes its bash sessions (inspect's own) is not refused after 16
    samples: the least recently used idle session makes room; a reclaimed session's name
    says what happened and is never given to another caller."""
    env = {**runtime_dir.env, "SANDBOX_TOOLS_MAX_SESSIONS": "4"}
    names = []
    for _ in range(10):
        names.append(call(env, "bash_session_new_session")["session_name"])
        out = call(
            env,
            "bash_session",
            {"session_name": names[-1], "input": "echo hi\n", "wait_for_output": 10},
        )
        assert "hi" in out
    assert len(set(names)) == 10
    old = cli(
        env,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "bash_session",
            "params": {"session_name": names[0], "input": "echo again\n"},
        },
    )
    assert "closed to make room" in old["error"]["message"]


async def test_the_host_never_uses_a_server_of_another_build(
    runtime_dir: RuntimeDir, tmp_path: Path
) -> None:
    """One build, one server, checked by the host once per connection: where a server
    of another build already listens (a shared SANDBOX_TOOLS_DIR, or one an agent with
    the runtime's uid started), the host's channel refuses it, naming both builds, and
    sends it nothing else."""
    from sandbox_tools.errors import RuntimeTransportError
    from sandbox_tools.injector.jsonrpc_client import StdioRuntimeClient
    from sandbox_tools.sandboxes.local import LocalSandbox

    other = tmp_path / "other-build"
    shutil.copytree(SRC, other, ignore=shutil.ignore_patterns("__pycache__"))
    info = other / "sandbox_tools" / "runtime" / "_build_info.json"
    info.write_text(json.dumps({"build_id": "sha256:" + "0" * 64, "format": "portable"}))
    env = runtime_dir.env
    theirs = call(env, "runtime_info", src=str(other))
    assert theirs["build_id"] == "sha256:" + "0" * 64
    command = [sys.executable, "-m", "sandbox_tools.runtime"]
    ours = StdioRuntimeClient(
        LocalSandbox(),
        command,
        env={"SANDBOX_TOOLS_DIR": runtime_dir.path, "PYTHONPATH": SRC},
        expected_build="source",
    )
    try:
        with pytest.raises(RuntimeTransportError, match="is build 'sha256:0000"):
            await ours.call("exec_remote_start", {"command": "touch /tmp/never"})
    finally:
        await ours.aclose()
    assert call(env, "runtime_info", src=str(other))["pid"] == theirs["pid"]
