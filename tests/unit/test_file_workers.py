"""File operations run on a bounded set of daemon workers, each awaited for a bounded time.

THREAT_MODEL.md, rule 5: a file operation stuck in the kernel (a hung file system) once
held one of the event loop's few executor threads for good, and the server's shutdown
waited for it forever.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.tools.text_editor import file_ops


async def test_a_stuck_operation_times_out_and_a_full_pool_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(file_ops, "FILE_OP_TIMEOUT", 0.5)
    workers = file_ops._FileWorkers(2)
    release = threading.Event()

    def stuck(path: str) -> str:
        release.wait(30)
        return path

    started = time.monotonic()
    for _ in range(2):
        with pytest.raises(ToolError, match=r"did not finish within 0\.5 s"):
            await workers.run(stuck, "/stuck", path="/stuck")
    assert time.monotonic() - started < 3
    # Both workers are still stuck: the next operation is refused at once, not queued.
    with pytest.raises(ToolError, match="all 2 file workers are busy"):
        await workers.run(stuck, "/x", path="/x")
    release.set()
    await asyncio.sleep(0.2)  # the stuck threads finish and free their slots
    assert await workers.run(lambda path: path.upper(), "/ok", path="/ok") == "/OK"


async def test_errors_reach_the_caller() -> None:
    def failing(path: str) -> None:
        raise ToolError(f"no {path}")

    with pytest.raises(ToolError, match="no /a"):
        await file_ops._FileWorkers(1).run(failing, "/a", path="/a")


@pytest.mark.skipif(os.geteuid() != 0, reason="running a child as a given uid needs root")
async def test_a_file_operation_as_another_user_that_never_answers_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """text_editor with user= waited on its child without a bound: the host call never
    returned. Now the child is killed and a tool error returned."""
    from sandbox_tools.runtime.identity import Identity

    monkeypatch.setattr(file_ops, "kind", lambda path: time.sleep(60))
    monkeypatch.setattr(file_ops, "FILE_OP_TIMEOUT", 0.5)
    access = file_ops.UserFileAccess(Identity(65534, 65534, [65534], "/", None))
    started = time.monotonic()
    with pytest.raises(ToolError, match="did not finish"):
        await access.kind("/tmp")
    assert time.monotonic() - started < 5


@pytest.mark.skipif(os.geteuid() != 0, reason="running a child as a given uid needs root")
async def test_a_file_operation_as_another_user_runs_with_exactly_its_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THREAT_MODEL rule 4: the forked child drops to the exact ids before it touches the
    path; a uid with no passwd entry works, and root's files stay closed to it."""
    from sandbox_tools.runtime.identity import Identity

    def ids(path: str) -> list[int]:
        return [os.getuid(), os.getgid(), *sorted(os.getgroups())]

    access = file_ops.UserFileAccess(Identity(4242, 4343, [4343, 77], "/", None))
    assert await access._run(ids, "/") == [4242, 4343, 77, 4343]
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    with pytest.raises(ToolError, match="permission denied"):
        await access.read_text(str(secret), 1024)
    assert await file_ops.DirectFileAccess().read_text(str(secret), 1024) == "root only"
