"""File operations as another user run in forked workers: their ids, and a stopped one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.tools.text_editor import file_ops


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
