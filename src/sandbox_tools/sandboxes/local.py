"""This machine as a sandbox: subprocesses, for tests and trusted use."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from sandbox_tools.artifacts import atomic_write
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_OUTPUT_LIMIT,
    DEFAULT_EXEC_TIMEOUT,
    MAX_STREAM_LINE,
    ExecOutput,
    OutputBudget,
    Sandbox,
    Stream,
    StreamLineTooLong,
    as_bytes,
    as_user,
)

KILL_WAIT = 10.0  # after SIGKILL to the group, the longest we wait for the pipes to close


class LocalSandbox(Sandbox):
    def __init__(self, base_env: Mapping[str, str] | None = None) -> None:
        self.name = "local"
        self._base_env = dict(base_env if base_env is not None else os.environ)

    @property
    def bytes_are_cheap(self) -> bool:
        return True  # the host itself

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**self._base_env, **(env or {})}

    async def exec(
        self,
        cmd: list[str],
        input: bytes | memoryview | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = DEFAULT_EXEC_OUTPUT_LIMIT,
    ) -> ExecOutput:
        cmd = as_user(cmd, user)
        data = as_bytes(input)
        process = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=self._env(env),
            # Its own process group, so that everything it started can be killed: a child
            # still holding the pipes would keep asyncio's wait() waiting forever.
            start_new_session=True,
        )
        budget = OutputBudget(max_output, f"{cmd[0]} (local)")
        try:
            stdout, stderr = await asyncio.wait_for(_communicate(process, data, budget), timeout)
        except BaseException as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(_discard_until_exit(process), KILL_WAIT)
            if isinstance(exc, asyncio.TimeoutError):  # not the builtin one before 3.11
                raise TimeoutError(f"{cmd[0]} did not finish within {timeout}s") from None
            raise
        assert process.returncode is not None
        return ExecOutput(process.returncode, stdout, stderr)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        atomic_write(Path(path), data, mode)

    async def read_file(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        cmd = as_user(cmd, user)
        process = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=self._env(env),
            limit=MAX_STREAM_LINE,
        )
        return _ProcessStream(process)


async def _communicate(
    process: asyncio.subprocess.Process, data: bytes | memoryview | None, budget: OutputBudget
) -> tuple[bytes, bytes]:
    """`communicate()`, but reading in blocks counted against the budget."""

    async def feed() -> None:
        if process.stdin is None:
            return
        with contextlib.suppress(ConnectionError):
            if data:
                process.stdin.write(data)
                await process.stdin.drain()
            process.stdin.close()

    async def drain(reader: asyncio.StreamReader | None) -> bytes:
        collected = bytearray()
        while reader is not None:
            block = await reader.read(1 << 16)
            if not block:
                break
            budget.take(len(block))
            collected += block
        return bytes(collected)

    feeder = asyncio.ensure_future(feed())
    readers = [
        asyncio.ensure_future(drain(process.stdout)),
        asyncio.ensure_future(drain(process.stderr)),
    ]
    try:
        await asyncio.gather(feeder, *readers)
    finally:
        # On a cap or a timeout, no reader may be left waiting on a pipe.
        for task in (feeder, *readers):
            task.cancel()
        await asyncio.gather(feeder, *readers, return_exceptions=True)
    await process.wait()
    return readers[0].result(), readers[1].result()


async def _discard_until_exit(process: asyncio.subprocess.Process) -> None:
    """Read the killed group's pipes to EOF (keeping nothing) so their transports close."""

    async def discard(reader: asyncio.StreamReader | None) -> None:
        while reader is not None and await reader.read(1 << 16):
            pass

    await asyncio.gather(discard(process.stdout), discard(process.stderr))
    await process.wait()


class _ProcessStream(Stream):
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._stdin = process.stdin
        self._stdout = process.stdout

    async def write(self, data: bytes) -> None:
        self._stdin.write(data)
        await self._stdin.drain()

    async def readline(self, limit: int = MAX_STREAM_LINE) -> bytes:
        try:
            line = await self._stdout.readline()
        except ValueError:  # asyncio's way of saying the line overran the limit
            raise StreamLineTooLong(
                f"the stream sent more than {MAX_STREAM_LINE} bytes without a newline"
            ) from None
        # This host's own processes: the reader's limit bounds the memory; a lower limit
        # is the caller's bound on what it takes.
        if len(line) > limit:
            raise StreamLineTooLong(f"the stream sent a line of more than {limit} bytes")
        return line

    async def close(self) -> None:
        if not self._stdin.is_closing():
            self._stdin.close()
            with contextlib.suppress(ConnectionError):
                await self._stdin.wait_closed()
        try:
            await asyncio.wait_for(self._process.wait(), 10)
        except asyncio.TimeoutError:
            self._process.kill()
            await self._process.wait()
