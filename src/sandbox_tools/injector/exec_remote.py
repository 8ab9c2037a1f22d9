"""exec_remote on the host: run a long-lived command in a sandbox and stream its output.

Built on any `RuntimeClient`. Output is pulled with long polls (`wait_ms`), so a
process's exit is seen as soon as it happens rather than at the next tick of a
fixed poll loop; each poll acknowledges what the previous one delivered.

A call that gets no answer in time raises `CallTimeoutError`, both a
`RuntimeTransportError` and a `TimeoutError`. Polls (and kill and close_stdin, which the
runtime takes as often as they come) can be re-sent after timing out
(`poll_timeout_retry`, `poll_timeout_recovery`): a re-sent poll carries the same
`ack_seq`, so it replays what the lost answer carried. A start or a stdin write is never
re-sent: the runtime cannot tell a second one from a new request, so the command would
run twice or the data arrive twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.jsonrpc_client import (
    DEFAULT_CALL_TIMEOUT,
    RuntimeClient,
    result_fields,
)
from sandbox_tools.protocol import User
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    JOB_STATES,
    KILLED,
    RUNNING,
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
# A kill sent for a cancelled caller runs in the background, where nobody waits for it: it
# gets the time a loaded machine or a slow runtime may need, so no process is orphaned.
BACKGROUND_KILL_TIMEOUT = 60.0
# Kills sent after their caller was cancelled, kept until done (a task needs a reference).
_BACKGROUND: set[asyncio.Task[None]] = set()
# A timed-out call is ended here this long before the transport's own timeout would end
# it, so a timeout is always told apart (CallTimeoutError) from other transport failures.
CALL_GRACE = 1.0
# Pause before a poll that timed out is sent again under `poll_timeout_recovery` (inspect's).
RECOVERY_WAIT = 5.0
# The longest a retried call may wait (inspect's schedule: the call's own timeout, then
# no more than this, then no more than half of it).
RETRY_TIMEOUT_CAP = 60.0

log = logging.getLogger(__name__)


class CallTimeoutError(RuntimeTransportError, TimeoutError):
    """A call to the runtime got no answer within its timeout (it may have been done)."""


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
    # Longest one call about the process (start, poll, write_stdin, close_stdin, kill)
    # may go unanswered; past it the call raises CallTimeoutError (a TimeoutError). A
    # long poll then waits server-side at most half of it, so a healthy runtime always
    # answers in time. None: each call's own bound (a poll's: its wait plus POLL_SLACK;
    # a kill's: KILL_TIMEOUT; others: the client's default).
    poll_timeout: float | None = None
    # Send a call that timed out again, up to twice (inspect's schedule: no more than
    # 60 s, then no more than 30 s): polls, close_stdin and an explicit kill(), which the
    # runtime takes as often as they come; never a start or a stdin write.
    poll_timeout_retry: bool = False
    # Keep sending a poll that timed out (after RECOVERY_WAIT) for this many seconds
    # after its first timeout; none once kill() was called. None: a timed-out poll raises.
    poll_timeout_recovery: float | None = None

    def __post_init__(self) -> None:
        if self.poll_timeout is not None and not self.poll_timeout > 0:
            raise ValueError(f"poll_timeout must be > 0 seconds, not {self.poll_timeout!r}")
        if self.poll_timeout_recovery is not None and not self.poll_timeout_recovery >= 0:
            raise ValueError(
                f"poll_timeout_recovery must be >= 0 seconds, not {self.poll_timeout_recovery!r}"
            )


class _Tail:
    """Keeps the newest `limit` characters of a stream. Small pieces are joined to the last
    one, so a process printing two bytes a poll costs its characters, not an object each."""

    JOIN_BELOW = 64 * 1024

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: deque[str] = deque()
        self._size = 0

    def add(self, text: str) -> None:
        if self._parts and len(self._parts[-1]) + len(text) <= self.JOIN_BELOW:
            self._parts[-1] += text
        else:
            self._parts.append(text)
        self._size += len(text)
        while self._size - len(self._parts[0]) >= self.limit:
            self._size -= len(self._parts.popleft())

    def value(self) -> str:
        text = "".join(self._parts)
        return text[-self.limit :] if len(text) > self.limit else text


def retry_timeouts(timeout: float, retry: bool) -> list[float]:
    """Each attempt's timeout for a call that may be sent again after timing out:
    inspect's schedule (its own timeout, then no more than 60 s, then half of that)."""
    if not retry:
        return [timeout]
    capped = min(timeout, RETRY_TIMEOUT_CAP)
    return [timeout, max(capped, 1.0), max(capped / 2, 1.0)]


async def _call(
    client: RuntimeClient, method: str, params: Mapping[str, Any], timeout: float
) -> Any:
    """One call, ended after `timeout` seconds with CallTimeoutError."""
    try:
        return await asyncio.wait_for(
            client.call(method, params, timeout=timeout + CALL_GRACE), timeout
        )
    except asyncio.TimeoutError:  # not the builtin one before 3.11
        raise CallTimeoutError(
            f"{method}: no answer from the runtime within {timeout:g} s"
        ) from None


async def _call_retried(
    client: RuntimeClient, method: str, params: Mapping[str, Any], timeout: float, retry: bool
) -> Any:
    """A call the runtime takes as often as it comes, sent again after timing out if `retry`."""
    timeouts = retry_timeouts(timeout, retry)
    for attempt, seconds in enumerate(timeouts, 1):
        try:
            return await _call(client, method, params, seconds)
        except CallTimeoutError:
            if attempt == len(timeouts):
                raise
            log.info("%s timed out after %g s; sending it again", method, seconds)
    raise AssertionError("unreachable")


async def _bounded(kill: Awaitable[object], seconds: float = KILL_TIMEOUT) -> None:
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(kill), seconds)


class ExecRemoteProcess:
    """A started process. Iterate `events()` (or `batches()`) once; leaving it early kills
    the process.

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
        """The result, set as soon as a poll reports the end (before its events are taken)."""
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
        batches = self.batches()
        try:
            async for batch in batches:
                for event in batch:
                    yield event
        finally:
            await batches.aclose()

    async def batches(self) -> AsyncGenerator[list[ExecEvent], None]:
        """What each poll brought, as `events()` yields it one by one: never an empty list,
        and the last one ends with the Completed (`completed` is set before it is yielded).

        The next poll is sent only once the consumer asks for the next batch.
        """
        deadline = (
            time.monotonic() + self.options.timeout if self.options.timeout is not None else None
        )
        stdout, stderr = _Tail(self.options.output_limit), _Tail(self.options.output_limit)
        try:
            while True:
                result = await self._poll(deadline)
                self._ack = result["seq"]
                batch: list[ExecEvent] = []
                if result["stdout"]:
                    stdout.add(result["stdout"])
                    batch.append(StdoutChunk(result["stdout"]))
                if result["stderr"]:
                    stderr.add(result["stderr"])
                    batch.append(StderrChunk(result["stderr"]))
                if result["state"] != RUNNING:
                    exit_code = result["exit_code"]
                    assert exit_code is not None  # _poll_result checked it for final states
                    self._completed = Completed(
                        exit_code=exit_code,
                        stdout=stdout.value(),
                        stderr=stderr.value(),
                        killed=result["state"] == KILLED,
                    )
                    await self._release()
                    batch.append(self._completed)
                    yield batch
                    return
                if batch:
                    yield batch
        except asyncio.CancelledError:
            if self._completed is None and not self._kill_sent:
                # The caller was cancelled (an outer deadline): it must not wait for the
                # kill too, which may take KILL_TIMEOUT against a stuck runtime. The kill
                # goes on in the background, with the longer background bound.
                self._kill_sent = True
                kill = _bounded(self._send_kill(BACKGROUND_KILL_TIMEOUT), BACKGROUND_KILL_TIMEOUT)
                task = asyncio.get_running_loop().create_task(kill)
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)
            raise
        finally:
            if self._completed is None and not self._kill_sent:
                # The consumer went away (broke out, timed out): no orphans.
                await self._kill_bounded()

    async def _past_deadline(self, cause: str = "") -> TimeoutError:
        await self._kill_bounded()
        return TimeoutError(f"command did not finish within {self.options.timeout} s{cause}")

    async def _poll(self, deadline: float | None) -> PollResult:
        """The next poll's answer; a poll that timed out is sent again as the options say."""
        recovery_deadline: float | None = None
        while True:
            try:
                return await self._poll_attempts(deadline)
            except CallTimeoutError as exc:
                recovery = self.options.poll_timeout_recovery
                if recovery is None or self._kill_sent:
                    raise
                now = time.monotonic()
                if recovery_deadline is None:
                    recovery_deadline = now + recovery
                if now >= recovery_deadline:
                    raise
                log.warning(
                    "exec_remote poll of pid %s: %s; polling again (ack_seq %s) for up to "
                    "%.0f s more",
                    self.pid,
                    exc,
                    self._ack,
                    recovery_deadline - now,
                )
                pause = RECOVERY_WAIT
                if deadline is not None:  # the caller's deadline ends the wait at once
                    pause = min(pause, max(0.0, deadline - now))
                await asyncio.sleep(pause)
                if self._kill_sent:
                    raise

    async def _poll_attempts(self, deadline: float | None) -> PollResult:
        """One poll, sent again up to twice after timing out if `poll_timeout_retry`."""
        options = self.options
        wait_s = max(0.0, options.poll_interval)
        if options.poll_timeout is None:
            first_timeout = wait_s + POLL_SLACK
        else:
            first_timeout = options.poll_timeout
            wait_s = min(wait_s, options.poll_timeout / 2)  # room for the answer to travel
        timeouts = retry_timeouts(first_timeout, options.poll_timeout_retry)
        for attempt, attempt_timeout in enumerate(timeouts, 1):
            wait = min(wait_s, attempt_timeout / 2) if attempt > 1 else wait_s
            call_timeout = attempt_timeout
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise await self._past_deadline("; killed")
                wait = min(wait, remaining + 0.001)
                # A stopped runtime must not hold the caller past its own deadline.
                call_timeout = min(call_timeout, remaining + 1.0)
            wait_ms = int(wait * 1000)
            started = time.monotonic()
            try:
                result = _poll_result(
                    await _call(
                        self.client,
                        "exec_remote_poll",
                        PollParams(pid=self.pid, ack_seq=self._ack, wait_ms=wait_ms).to_params(),
                        call_timeout,
                    )
                )
            except RuntimeTransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise await self._past_deadline(
                        " (the runtime stopped answering); kill attempted"
                    ) from None
                if isinstance(exc, CallTimeoutError) and attempt < len(timeouts):
                    log.info("exec_remote poll of pid %s: %s; sending it again", self.pid, exc)
                    continue
                raise
            idle = not result["stdout"] and not result["stderr"]
            elapsed = time.monotonic() - started
            if result["state"] == RUNNING and idle and elapsed < wait_ms / 2000:
                # A runtime without long polling answered at once: do not spin.
                await asyncio.sleep(wait_ms / 1000 - elapsed)
            return result
        raise AssertionError("unreachable")

    async def _release(self) -> None:
        """Acknowledge the terminal result so the server can drop what it kept for us."""
        with contextlib.suppress(Exception):
            await _call(self.client, "exec_remote_poll", self._acknowledged(), KILL_TIMEOUT)

    async def wait(self) -> Completed:
        """Drain the events and return the result."""
        async for event in self.events():
            if isinstance(event, Completed):
                return event
        raise AssertionError("events() ended without a Completed event")

    async def kill(self) -> tuple[str, str]:
        """Kill the process and its group (once; a finished process is left alone).

        Returns the stdout and stderr the runtime held that no poll had delivered (what
        the kill's answer carried; empty when no kill was sent). `events()` goes on with
        the same output, as the kill acknowledges nothing new.
        """
        if self._kill_sent or self._completed is not None:
            return "", ""
        self._kill_sent = True
        return await self._send_kill()

    async def _send_kill(self, patience: float = KILL_TIMEOUT) -> tuple[str, str]:
        if self._completed is not None:
            return "", ""
        timeout = self.options.poll_timeout or patience
        result = await _call_retried(
            self.client,
            "exec_remote_kill",
            self._acknowledged(),
            timeout,
            self.options.poll_timeout_retry,
        )
        fields = result_fields(result, "exec_remote_kill", stdout=str, stderr=str)
        return fields["stdout"], fields["stderr"]

    async def write_stdin(self, data: str) -> None:
        """Send text to the process's stdin (it must have been started with stdin open).

        Never sent twice, even with `poll_timeout_retry`: the data would arrive twice."""
        await _call(
            self.client,
            "exec_remote_write_stdin",
            WriteStdinParams(pid=self.pid, ack_seq=self._ack, data=data).to_params(),
            self.options.poll_timeout or DEFAULT_CALL_TIMEOUT,
        )

    async def close_stdin(self) -> None:
        """Close its stdin: a program reading to EOF can then finish."""
        await _call_retried(
            self.client,
            "exec_remote_close_stdin",
            self._acknowledged(),
            self.options.poll_timeout or DEFAULT_CALL_TIMEOUT,
            self.options.poll_timeout_retry,
        )

    def _acknowledged(self) -> dict[str, Any]:
        """A pid and how far its output was taken: kill, close_stdin, the final poll."""
        return AckParams(pid=self.pid, ack_seq=self._ack).to_params()


def _poll_result(result: Any) -> PollResult:
    """A poll's result, checked field by field before anything is taken from it."""
    checked = result_fields(result, "exec_remote_poll", seq=int, stdout=str, stderr=str, state=str)
    state = next((s for s in JOB_STATES if s == checked["state"]), None)
    if state is None:
        raise RuntimeTransportError(f"exec_remote_poll: unknown state {checked['state']!r}")
    exit_code = None
    if state != RUNNING:
        exit_code = result_fields(result, "exec_remote_poll", exit_code=int)["exit_code"]
    return PollResult(
        seq=checked["seq"],
        stdout=checked["stdout"],
        stderr=checked["stderr"],
        state=state,
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
    # Never sent twice, even with `poll_timeout_retry`: the command would run twice.
    timeout = options.poll_timeout or DEFAULT_CALL_TIMEOUT
    answer = await _call(client, "exec_remote_start", params, timeout)
    result = result_fields(answer, "exec_remote_start", pid=int)
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
