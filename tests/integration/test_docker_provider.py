"""The docker provider and exec_remote into a real container (runtime from source)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, StdoutChunk, exec_remote
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    StdioRuntimeClient,
    connect_runtime,
)
from sandbox_tools.injector.source_runtime import mounted_source_runtime

pytestmark = pytest.mark.docker


async def test_exec_with_stdin_env_cwd_user(docker_engine: Any, python_container: Any) -> None:
    sandbox = python_container.sandbox
    out = await sandbox.exec(
        ["sh", "-c", "cat; echo $X; pwd; id -u"],
        input=b"piped\n",
        env={"X": "from-env"},
        cwd="/tmp",
        user="65534",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().split() == ["piped", "from-env", "/tmp", "65534"]

    failed = await sandbox.exec(["sh", "-c", "echo oops >&2; exit 4"])
    assert (failed.returncode, failed.stderr) == (4, b"oops\n")


async def test_write_and_read_file_round_trip(docker_engine: Any, python_container: Any) -> None:
    sandbox = python_container.sandbox
    payload = bytes(range(256)) * 4096  # 1 MiB of every byte value
    await sandbox.write_file("/tmp/blob.bin", payload, mode=0o600)
    assert await sandbox.read_file("/tmp/blob.bin") == payload
    mode = await sandbox.exec(["stat", "-c", "%a", "/tmp/blob.bin"])
    assert mode.stdout.strip() == b"600"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("/tmp/does-not-exist")


@pytest.mark.parametrize("transport", [StdioRuntimeClient, ExecRuntimeClient])
async def test_exec_remote_into_a_container(
    docker_engine: Any, python_container: Any, transport: type
) -> None:
    sandbox = python_container.sandbox
    launch = mounted_source_runtime()
    client = transport(sandbox, launch.command, env=launch.env)
    try:
        info = await client.call("runtime_info")
        assert info["version"] == "0.1.0" and info["build_id"] == "source"

        result = await exec_remote(
            client, "cat /etc/debian_version; echo err >&2; exit 2", stream=False
        )
        assert (result.returncode, result.stderr) == (2, "err\n")
        assert result.stdout.strip().startswith("12")

        process = await exec_remote(
            client,
            "for i in 1 2 3; do echo line$i; sleep 0.2; done",
            ExecRemoteOptions(poll_interval=2),
        )
        chunks = [e.data async for e in process.events() if isinstance(e, StdoutChunk)]
        assert "".join(chunks) == "line1\nline2\nline3\n"

        with pytest.raises(TimeoutError):
            await exec_remote(client, "sleep 60", ExecRemoteOptions(timeout=1), stream=False)
        with pytest.raises(ToolError, match="nobody-here"):
            await exec_remote(client, "true", ExecRemoteOptions(user="nobody-here"))
    finally:
        await client.aclose()


async def test_connect_runtime_prefers_the_persistent_channel(
    docker_engine: Any, python_container: Any
) -> None:
    sandbox = python_container.sandbox
    launch = mounted_source_runtime()
    client = await connect_runtime(sandbox, launch.command, env=launch.env)
    try:
        assert isinstance(client, StdioRuntimeClient)
        answers = await asyncio.gather(*(client.call("version") for _ in range(20)))
        assert answers == ["0.1.0"] * 20
    finally:
        await client.aclose()
