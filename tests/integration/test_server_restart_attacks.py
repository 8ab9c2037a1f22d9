"""Attacks on a runtime server that dies and is started again, or is made to: found by an
outside attack on the long-lived-server surfaces. Real runtime processes from source."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.tools.bash_session.controller import BashSessionController
from sandbox_tools.runtime.tools.bash_session.tool_types import (
    CloseSessionParams,
    InteractParams,
    NewSessionParams,
)
from tests.support import RuntimeDir, eventually

pytestmark = pytest.mark.security


def test_a_name_from_before_a_restart_reaches_no_shell_of_the_next_server(
    runtime_dir: RuntimeDir,
) -> None:
    """THREAT_MODEL.md rule 1: names and ids were counted from the start in every server,
    so after a restart (an agent can get the server OOM-killed) a name the agent held
    from before reached the next shell of that name: a root one, in the attack."""
    old = runtime_dir.result("bash_session_new_session")["session_name"]
    mcp_old = runtime_dir.result("mcp_launch_server", {"server_params": {"command": "cat"}})
    pid = runtime_dir.server_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: runtime_dir.call("version").get("result") is not None, "a new server")
    assert runtime_dir.server_pid() not in (None, pid)
    new = runtime_dir.result("bash_session_new_session")["session_name"]
    assert new != old
    answer = runtime_dir.call("bash_session", {"session_name": old, "input": "id -u\n"})
    assert "no bash session named" in answer["error"]["message"]
    mcp_new = runtime_dir.result("mcp_launch_server", {"server_params": {"command": "cat"}})
    assert mcp_new != mcp_old


def test_a_root_server_is_not_what_the_oom_killer_picks(runtime_dir: RuntimeDir) -> None:
    """THREAT_MODEL.md rule 5: memory an agent charges to the container (memfd) made the
    OOM killer pick the server, the largest process, with every session in it. A root
    server lowers its score; what it starts gets the default back."""
    if os.geteuid() != 0:
        pytest.skip("only root may lower an OOM score")
    probe = subprocess.run(
        [sys.executable, "-c", "p='/proc/self/oom_score_adj'; open(p,'w').write('-900');"
         "print(open(p).read().strip())"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if probe.stdout.strip() != "-900":
        pytest.skip(f"this kernel does not keep OOM scores (wrote -900, read {probe.stdout!r})")
    runtime_dir.result("version")
    pid = runtime_dir.server_pid()
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "-900"
    job = runtime_dir.result(
        "exec_remote_start", {"command": "cat /proc/self/oom_score_adj; sleep 0.2"}
    )
    seen = ""
    for _ in range(50):
        polled = runtime_dir.result("exec_remote_poll", {"pid": job["pid"], "wait_ms": 500})
        seen += polled["stdout"]
        if polled["state"] != "running":
            break
    assert seen == "0\n"


async def test_closing_a_session_while_it_restarts_leaves_it_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THREAT_MODEL.md rule 6: a close during a slow restart killed the new shell, closed
    the terminal's descriptor twice (by then another client's socket) and the restart
    then brought the closed session back."""
    (tmp_path / ".bashrc").write_text("sleep 1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    controller = BashSessionController()
    try:
        name = (await controller.new_session(NewSessionParams(user=None)))["session_name"]
        restart = asyncio.create_task(
            controller.interact(InteractParams.parse({"session_name": name, "restart": True}))
        )
        await asyncio.sleep(0.3)
        assert controller.close(CloseSessionParams(session_name=name)) == {"closed": True}
        spare = os.open("/dev/null", os.O_RDONLY)  # may take the old terminal's number
        with pytest.raises(ToolError, match="closed by its host"):
            await restart
        os.fstat(spare)  # still open: nobody closed it twice
        os.close(spare)
        with pytest.raises(ToolError, match="closed by its host"):
            await controller.interact(InteractParams.parse({"session_name": name}))
    finally:
        await controller.shutdown()


async def test_a_reused_pid_never_hands_one_caller_another_job() -> None:
    """THREAT_MODEL.md rule 2: jobs were keyed by the OS pid, so an agent that cycled the
    pid space had its own job take the pid of a root job the host had not collected, and
    the host's next poll returned the agent's output as its job's result. Here the pids
    the next start may get already belong to jobs whose callers have not collected them."""
    from sandbox_tools.runtime.tools.exec_remote.controller import (
        PID_SPACE,
        ExecRemoteController,
    )
    from sandbox_tools.runtime.tools.exec_remote.delivery import FinalResult
    from sandbox_tools.runtime.tools.exec_remote.tool_types import PollParams, StartParams

    controller = ExecRemoteController()
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    earlier = FinalResult(state="completed", exit_code=1, seq=3)
    for pid in range(last + 1, last + 500):  # the host's jobs, ended, not yet collected
        controller._remembered_results[pid] = earlier
    try:
        started = await controller.start(StartParams.parse({"command": "echo agent; exit 0"}))
        handle = started["pid"]
        os_pid = next(j.process.pid for j in controller._jobs.values() if j.pid == handle)
        if not last < os_pid < last + 500:
            pytest.skip("another process took the pids this test prepared")
        assert handle >= PID_SPACE and handle != os_pid
        theirs = await controller.poll(PollParams.parse({"pid": os_pid, "ack_seq": 0}))
        assert (theirs["exit_code"], theirs["stdout"]) == (1, "")  # the host's job, still
        ours = await controller.poll(PollParams.parse({"pid": handle, "wait_ms": 3000}))
        output = ours["stdout"]
        while ours["state"] == "running":
            ours = await controller.poll(
                PollParams.parse({"pid": handle, "ack_seq": ours["seq"], "wait_ms": 3000})
            )
            output += ours["stdout"]
        assert (output, ours["exit_code"]) == ("agent\n", 0)
    finally:
        await controller.shutdown()
