"""File operations run on a bounded set of daemon workers, each awaited for a bounded time.

THREAT_MODEL.md, rule 5: a file operation stuck in the kernel (a hung file system) once
held one of the event loop's few executor threads for good, and the server's shutdown
waited for it forever.
"""

from __future__ import annotations

import asyncio
import threading
import time

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
