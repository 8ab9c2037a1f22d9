"""exec_remote on the host: run a long-lived command in a sandbox and stream its output.

Built on any `RuntimeClient`. Output is pulled with long polls (`wait_ms`), so a
process's exit is seen as soon as it happens rather than at the next tick of a
fixed poll loop; each poll acknowledges what the previous one delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.jsonrpc_client import RuntimeClient, result_fields
from sandbox_tools.protocol import User
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    AckParams,
    PollParams,
    PollResult,
    StartParams,
    WriteStdinParams,
)

DEFAULT_OUTPUT_LIMIT = 10 * 1024 * 1024
# A poll may take its server-side wait plus this much for the transport; past that the
# runtime is taken to be stopped or gone (THREAT_MODEL.md, rule 3).
POLL_SLACK = 15.0
# Killing (and the cleanup that does it) is bounded: a runtime that does not answer
# within this long is left as it is, and the caller gets its answer anyway.
KILL_TIMEOUT = 5.0
# Kills sent after their caller was cancelled, kept until done (a task needs a reference).
_BACKGROUND: set[asyncio.Task[None]] = set()
_STATES = ("running", "completed", "killed")


@dataclass(frozen=True)
class StdoutChunk:
    data: str


@dataclass(frozen=True)
class StderrChunk:
    data: str


@dataclass(frozen=True)
class Completed:
    """The process ended; stdout/stderr hold its output (newest bytes past the cap)."""

    exit_code: int
    stdout: str
    stderr: str
    killed: bool = False


ExecEvent = StdoutChunk | StderrChunk | Completed


@dataclass(frozen=True)
class ExecResult:
    success: bool
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True, kw_only=True)
class ExecRemoteOptions:
    input: str | None = None
    stdin_open: bool = False
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    user: User | None = None
    timeout: float | None = None
    # Longest a single long poll waits server-side for news; also the sleep between
    # polls against a runtime that does not support long polling.
    poll_interval: float = 5.0
    output_limit: int = DEFAULT_OUTPUT_LIMIT


class _Tail:
    """Keeps the newest `limit` characters of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: deque[str] = deque()
        self._size = 0

    def add(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        while self._size - len(self._parts[0]) >= self.limit:
            self._size -= len(self._parts.popleft())

    def value(self) -> str:
        text = "".join(self._parts)
        return text[-self.limit :] if len(text) > self.limit else text


async def _bounded(kill: Awaitable[None]) -> None:
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(kill), KILL_TIMEOUT)


class ExecRemoteProcess:
    """A started process. Iterate `events()` once; leaving it early kills the process.

    Use it as `async with` to have the process killed even if nothing ever iterated.
    """

    def __init__(self, client: RuntimeClient, pid: int, options: ExecRemoteOptions) -> None:
        self.client = client
        self.pid = pid
        self.options = options
        self._ack = 0
        self._completed: Completed | None = None
        self._kill_sent = False

    @property
    def completed(self) -> Completed | None:
        return self._completed

    async def __aenter__(self) -> ExecRemoteProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Leaving the block kills a process that has not completed, however it is left."""
        if self._completed is None:
            await self._kill_bounded()

    async def _kill_bounded(self) -> None:
        """Kill (once), shielded from the caller's cancellation but never waited on for long."""
        await _bounded(self.kill())

    async def events(self) -> AsyncIterator[ExecEvent]:
        """Output chunks as they arrive, then exactly one Completed.

        A chunk is acknowledged (the runtime may drop it) only by the poll after the
        consumer took it; a consumer that stops early kills the process, leaving no orphan.
        """
        deadline = (
            time.monotonic() + self.options.timeout if self.options.timeout is not None else None
        )
        stdout, stderr = _Tail(self.options.output_limit), _Tail(self.options.output_limit)
        wait_ms = max(0, int(self.options.poll_interval * 1000))
        try:
            while True:
                call_timeout = wait_ms / 1000 + POLL_SLACK
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        await self._kill_bounded()
                        raise TimeoutError(
                            f"command did not finish within {self.options.timeout} s; killed"
                        )
                    wait_ms = min(wait_ms, int(remaining * 1000) + 1)
                    # A stopped runtime must not hold the caller past its own deadline.
                    call_timeout = min(wait_ms / 1000 + POLL_SLACK, remaining + 1.0)
                requested_s = wait_ms / 1000
                started = time.monotonic()
                try:
                    result = _poll_result(
                        await self.client.call(
                            "exec_remote_poll",
                            PollParams(
                                pid=self.pid, ack_seq=self._ack, wait_ms=wait_ms
                            ).to_params(),
                            timeout=call_timeout,
                        )
                    )
                except RuntimeTransportError:
                    if deadline is not None and time.monotonic() >= deadline:
                        await self._kill_bounded()
                        raise TimeoutError(
                            f"command did not finish within {self.options.timeout} s "
                            "(the runtime stopped answering); kill attempted"
                        ) from None
                    raise
                self._ack = result["seq"]
                if result["stdout"]:
                    stdout.add(result["stdout"])
                    yield StdoutChunk(result["stdout"])
                if result["stderr"]:
                    stderr.add(result["stderr"])
                    yield StderrChunk(result["stderr"])
                if result["state"] != "running":
                    exit_code = result["exit_code"]
                    assert exit_code is not None  # _poll_result checked it for final states
                    self._completed = Completed(
                        exit_code=exit_code,
                        stdout=stdout.value(),
                        stderr=stderr.value(),
                        killed=result["state"] == "killed",
                    )
                    await self._release()
                    yield self._completed
                    return
                idle = not result["stdout"] and not result["stderr"]
                elapsed = time.monotonic() - started
                if idle and elapsed < requested_s / 2:
                    # A runtime without long polling answered at once: do not spin.
                    await asyncio.sleep(requested_s - elapsed)
        except asyncio.CancelledError:
            if self._completed is None and not self._kill_sent:
                # The caller was cancelled (an outer deadline): it must not wait for the
                # kill too, which may take KILL_TIMEOUT against a stuck runtime. The kill
                # goes on in the background, bounded as ever.
                self._kill_sent = True
                task = asyncio.get_running_loop().create_task(_bounded(self._send_kill()))
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)
            raise
        finally:
            if self._completed is None and not self._kill_sent:
                # The consumer went away (broke out, timed out): no orphans.
                await self._kill_bounded()

    async def _release(self) -> None:
        """Acknowledge the terminal result so the server can drop what it kept for us."""
        with contextlib.suppress(Exception):
            await self.client.call("exec_remote_poll", self._acknowledged(), timeout=KILL_TIMEOUT)

    async def wait(self) -> Completed:
        """Drain the events and return the result."""
        async for event in self.events():
            if isinstance(event, Completed):
                return event
        raise AssertionError("events() ended without a Completed event")

    async def kill(self) -> None:
        """Kill the process and its group (once; a finished process is left alone)."""
        if self._kill_sent or self._completed is not None:
            return
        self._kill_sent = True
        await self._send_kill()

    async def _send_kill(self) -> None:
        if self._completed is None:
            await self.client.call("exec_remote_kill", self._acknowledged(), timeout=KILL_TIMEOUT)

    async def write_stdin(self, data: str) -> None:
        """Send text to the process's stdin (it must have been started with stdin open)."""
        await self.client.call(
            "exec_remote_write_stdin",
            WriteStdinParams(pid=self.pid, ack_seq=self._ack, data=data).to_params(),
        )

    async def close_stdin(self) -> None:
        """Close its stdin: a program reading to EOF can then finish."""
        await self.client.call("exec_remote_close_stdin", self._acknowledged())

    def _acknowledged(self) -> dict[str, Any]:
        """A pid and how far its output was taken: kill, close_stdin, the final poll."""
        return AckParams(pid=self.pid, ack_seq=self._ack).to_params()


def _poll_result(result: Any) -> PollResult:
    """A poll's result, checked field by field before anything is taken from it."""
    checked = result_fields(result, "exec_remote_poll", seq=int, stdout=str, stderr=str, state=str)
    if checked["state"] not in _STATES:
        raise RuntimeTransportError(f"exec_remote_poll: unknown state {checked['state']!r}")
    exit_code = None
    if checked["state"] != "running":
        exit_code = result_fields(result, "exec_remote_poll", exit_code=int)["exit_code"]
    return PollResult(
        seq=checked["seq"],
        stdout=checked["stdout"],
        stderr=checked["stderr"],
        state=checked["state"],
        exit_code=exit_code,
    )


def _command_string(cmd: str | Sequence[str]) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(cmd)


async def start_exec_remote(
    client: RuntimeClient, cmd: str | Sequence[str], options: ExecRemoteOptions | None = None
) -> ExecRemoteProcess:
    """Start `cmd` and return at once: the process's output is read by iterating its events."""
    options = options or ExecRemoteOptions()
    params = StartParams(
        command=_command_string(cmd),
        input=options.input,
        stdin_open=options.stdin_open,
        env=dict(options.env) if options.env else None,
        cwd=options.cwd,
        user=None,
    ).to_params(user=options.user)
    result = result_fields(
        await client.call("exec_remote_start", params), "exec_remote_start", pid=int
    )
    return ExecRemoteProcess(client, result["pid"], options)


@overload
async def exec_remote(
    client: RuntimeClient,
    cmd: str | Sequence[str],
    options: ExecRemoteOptions | None = ...,
    stream: Literal[True] = ...,
) -> ExecRemoteProcess: ...


@overload
async def exec_remote(
    client: RuntimeClient,
    cmd: str | Sequence[str],
    options: ExecRemoteOptions | None = ...,
    *,
    stream: Literal[False],
) -> ExecResult: ...


async def exec_remote(
    client: RuntimeClient,
    cmd: str | Sequence[str],
    options: ExecRemoteOptions | None = None,
    stream: bool = True,
) -> ExecRemoteProcess | ExecResult:
    """Start `cmd` (a shell string, or argv that is quoted for you) in the sandbox.

    stream=True: the started `ExecRemoteProcess`. stream=False: wait for the
    `ExecResult`. With `timeout`, the process is killed and TimeoutError raised.
    """
    process = await start_exec_remote(client, cmd, options)
    if stream:
        return process
    completed = await process.wait()
    return ExecResult(
        success=completed.exit_code == 0 and not completed.killed,
        returncode=completed.exit_code,
        stdout=completed.stdout,
        stderr=completed.stderr,
    )
