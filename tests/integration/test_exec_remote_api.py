"""The host-side exec_remote API against a runtime server in a child process on this
machine: what watches that server's process (its memory, its death, a stop) or the
processes it runs. Host logic alone runs against the server in the test's own process
(tests/local/test_host_api_in_process.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecRemoteOptions,
    StdoutChunk,
    exec_remote,
)
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    RuntimeClient,
    StdioRuntimeClient,
)
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.sandboxes.local import LocalSandbox
from tests.support import RuntimeDir


@pytest.fixture(params=["stdio", "exec"])
async def client(
    request: pytest.FixtureRequest, runtime_dir: RuntimeDir
) -> AsyncIterator[RuntimeClient]:
    launch = local_source_runtime(runtime_dir.path)
    env = {**launch.env, "SANDBOX_TOOLS_KILL_GRACE": "0.5"}
    kind = StdioRuntimeClient if request.param == "stdio" else ExecRuntimeClient
    runtime_client = kind(LocalSandbox(), launch.command, env=env)
    yield runtime_client
    await runtime_client.aclose()


@pytest.fixture
async def stdio_client(runtime_dir: RuntimeDir) -> AsyncIterator[RuntimeClient]:
    launch = local_source_runtime(runtime_dir.path)
    runtime_client = StdioRuntimeClient(LocalSandbox(), launch.command, env=launch.env)
    yield runtime_client
    await runtime_client.aclose()


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing for {pid}")


async def test_timeout_kills_and_raises(client: RuntimeClient) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await exec_remote(client, "sleep 60", ExecRemoteOptions(timeout=1), stream=False)
    assert time.monotonic() - started < 30


async def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30  # a loaded machine: the kill may take a while to land
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    try:  # a zombie (killed, not reaped) and a live process fail differently
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
    except (OSError, IndexError):
        return
    raise AssertionError(f"process {pid} survived 30 s: state {state}, {command!r}")


async def _started_pid(marker: Path) -> int:
    while not marker.exists() or not marker.read_text().strip():
        await asyncio.sleep(0.05)
    return int(marker.read_text())


async def test_cancelling_the_consumer_kills_the_process(
    stdio_client: RuntimeClient, tmp_path: Path
) -> None:
    marker = tmp_path / "pid"
    process = await exec_remote(stdio_client, f"echo $$ > {marker}; exec sleep 300")
    polling = asyncio.Event()

    async def consume() -> None:
        polling.set()
        async for _ in process.events():
            pass

    task = asyncio.create_task(consume())
    pid = await _started_pid(marker)
    await polling.wait()
    await asyncio.sleep(0.1)  # the consumer is now inside a long poll
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_gone(pid)


async def test_leaving_the_block_kills_even_without_a_consumer(
    stdio_client: RuntimeClient, tmp_path: Path
) -> None:
    marker = tmp_path / "pid"

    async def body() -> None:
        async with await exec_remote(stdio_client, f"echo $$ > {marker}; exec sleep 300"):
            await asyncio.sleep(300)

    task = asyncio.create_task(body())
    pid = await _started_pid(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_gone(pid)


async def test_fifty_megabytes_stream_in_order_without_memory_growth(
    stdio_client: RuntimeClient,
) -> None:
    info = await stdio_client.call("runtime_info")
    server = info["pid"]
    baseline = rss_kib(server)
    total_lines = 7_000_000  # `seq` output of about 55 MB
    process = await exec_remote(
        stdio_client, f"seq 1 {total_lines}", ExecRemoteOptions(output_limit=1024 * 1024)
    )
    expected, carry, size = 1, "", 0
    async for event in process.events():
        if isinstance(event, StdoutChunk):
            size += len(event.data)
            lines = (carry + event.data).split("\n")
            carry = lines.pop()
            for line in lines:
                assert int(line) == expected
                expected += 1
        elif isinstance(event, Completed):
            assert event.exit_code == 0
            assert len(event.stdout) == 1024 * 1024  # capped, newest kept
            assert event.stdout.endswith(f"{total_lines}\n")
    assert carry == "" and expected == total_lines + 1 and size > 50_000_000
    growth_mib = (rss_kib(server, "VmHWM") - baseline) / 1024
    assert growth_mib < 40, f"server peak memory grew by {growth_mib:.0f} MiB"


async def test_unpolled_output_is_paused_not_buffered(stdio_client: RuntimeClient) -> None:
    info = await stdio_client.call("runtime_info")
    baseline = rss_kib(info["pid"])
    process = await exec_remote(stdio_client, "yes 0123456789012345678901234567890123456789")
    await asyncio.sleep(3)  # `yes` would write gigabytes in this time if nothing stopped it
    growth_mib = (rss_kib(info["pid"]) - baseline) / 1024
    assert growth_mib < 40, f"server memory grew by {growth_mib:.0f} MiB while nobody polled"
    first = await stdio_client.call("exec_remote_poll", {"pid": process.pid, "ack_seq": 0})
    assert first["state"] == "running" and first["stdout"].startswith("0123")
    await process.kill()
    completed = await process.wait()
    assert completed.killed


async def test_stdio_channel_recovers_when_the_server_dies(
    stdio_client: RuntimeClient, runtime_dir: RuntimeDir
) -> None:
    first = await stdio_client.call("runtime_info")
    os.kill(first["pid"], 9)
    # The in-flight bridge notices; later calls restart the server.
    deadline = time.monotonic() + 20
    while True:
        try:
            second = await stdio_client.call("runtime_info")
            break
        except Exception:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    assert second["pid"] != first["pid"]


@pytest.mark.security
async def test_an_outer_deadline_is_kept_even_when_the_runtime_is_stopped(
    stdio_client: RuntimeClient, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rule 3 (the host is never hung): a caller's own deadline around
    exec_remote holds when the runtime stops answering (SIGSTOP, as an agent with its
    uid can do); the kill that follows goes on in the background instead of holding the
    caller for its own timeout too."""
    await stdio_client.call("version")
    pid = runtime_dir.server_pid()
    assert pid is not None
    run = asyncio.ensure_future(
        exec_remote(stdio_client, "sleep 100", ExecRemoteOptions(timeout=30), stream=False)
    )
    await asyncio.sleep(0.5)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(run, 2)
        assert time.monotonic() - started < 3.5  # the kill's own 5 s are not added
    finally:
        os.kill(pid, signal.SIGCONT)
