"""exec_remote: long-running processes with acknowledged, bounded output delivery.

Transport-agnostic; this module owns the processes, pipes, clocks and waiting, and
delivery.py the pure buffering and acknowledgement logic of each job's output.
Design points (PROTOCOL.md, "exec_remote delivery"):
- every piece of output is a chunk with a sequence number and stays buffered until
  the client acknowledges it (`ack_seq`), so a lost response loses nothing;
- buffers are bounded: when a job holds `Limits.exec_buffer_bytes` unacknowledged bytes its
  pipe readers pause, the pipe fills, and the process blocks on write (backpressure);
- the terminal state gets a sequence number of its own and is reported only once
  all output has been delivered; it stays until acknowledged, and a small table of
  acknowledged results answers retried polls with the same exit code;
- stdin never holds a call: `input` is queued at start, `write_stdin` waits at most
  `Limits.stdin_timeout_s` for the pipe to take its data (else a clear error),
  `close_stdin` returns at once (queued input stays ahead of the end of file; input
  a process never reads is dropped when it exits).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import shutil
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from sandbox_tools.protocol import ErrorReason
from sandbox_tools.runtime.child_env import child_environment, unprotect
from sandbox_tools.runtime.identity import resolve_user
from sandbox_tools.runtime.jsonrpc import CALLER_CWD, ToolError, caller_cwd
from sandbox_tools.runtime.limits import DEFAULT_LIMITS, Limits
from sandbox_tools.runtime.tools.exec_remote.delivery import (
    STDERR,
    STDOUT,
    Delivery,
    FinalResult,
    Stream,
)
from sandbox_tools.runtime.tools.exec_remote.tool_types import (
    AckParams,
    OutputResult,
    PollParams,
    PollResult,
    StartParams,
    StartResult,
    WriteStdinParams,
)

# After the command exits, output still arriving from its pipes is collected until the
# pipes close or stay silent this long (a `cmd &` child may hold them forever).
DRAIN_IDLE_S = 1.0
# Terminal results nobody acknowledged are dropped after this long.
UNACKED_RESULT_TTL_S = 1800.0
# Acknowledged results kept to answer retried polls with the same exit code.
REMEMBERED_RESULTS = 1024
READ_SIZE = 64 * 1024


# Linux pids stay below 2**22 (pid_max's ceiling): handles from here on are never pids.
PID_SPACE = 1 << 22


@dataclass
class _Job:
    """A running (or finished, not yet released) process and its output delivery."""

    pid: int  # the job's handle on the wire: its OS pid, unless that was still in use
    process: asyncio.subprocess.Process
    delivery: Delivery
    kill_requested: bool = False
    finished_at: float | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    stdin_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_output_at: float = field(default_factory=time.monotonic)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def append(self, stream: Stream, text: str, size: int) -> None:
        if self.delivery.append(stream, text, size):  # after the end, output is dropped
            self.last_output_at = time.monotonic()
            await self.notify()

    async def wait_for_space(self) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.delivery.has_room)

    async def acknowledge(self, ack_seq: int) -> None:
        if self.delivery.acknowledge(ack_seq):
            await self.notify()


def _pending_stdin(stdin: asyncio.StreamWriter) -> int:
    """Bytes queued for a process's stdin that its pipe has not taken yet."""
    return stdin.transport.get_write_buffer_size()


def _discard_stdin(job: _Job) -> None:
    stdin = job.process.stdin
    if stdin is not None and _pending_stdin(stdin):
        stdin.transport.abort()


def _exit_code(returncode: int) -> int:
    # Shell convention: death by signal N reads as 128 + N.
    return 128 - returncode if returncode < 0 else returncode


class ExecRemoteController:
    def __init__(self, limits: Limits = DEFAULT_LIMITS, lost_jobs_note: str | None = None) -> None:
        self.limits = limits  # read once by the server (Limits.from_environ)
        self._jobs: dict[int, _Job] = {}
        self._spare_handles = 0
        self._remembered_results: OrderedDict[int, FinalResult] = OrderedDict()
        # Set when this server replaced one that died: its jobs are gone.
        self._lost_jobs_note = lost_jobs_note
        self._shell = shutil.which("bash") or "/bin/sh"
        self._starting = 0  # starts past the limit check that hold no job yet

    # -- methods -------------------------------------------------------------------------

    async def start(self, params: StartParams) -> StartResult:
        # Check and reserve in one step, before any await: starts racing each other must
        # not all pass the check (300 concurrent starts were once all accepted).
        held = len(self._jobs) + self._starting
        if held >= self.limits.max_jobs:
            raise ToolError(
                f"too many processes: {held} are running, starting or have output nobody "
                f"collected (at most {self.limits.max_jobs}); poll them to the end or kill "
                "some first",
                ErrorReason.TOO_MANY,
            )
        self._starting += 1
        try:
            return await self._start(params)
        finally:
            self._starting -= 1  # the job holds its own slot now, or it never started

    async def _start(self, params: StartParams) -> StartResult:
        identity = resolve_user(params.user)
        env = child_environment({**identity.env(), **(params.env or {})})
        argv = [self._shell, "-c", params.command]
        cwd = params.cwd
        if identity.uid is not None:
            # Another user: the directory is entered by the child *after* the uid switch,
            # so the kernel decides whether that user may (subprocess would chdir as root
            # first: a job of uid 1000 could then read inside /root).
            # Without `cwd`: where the call came from (the sandbox's working directory, as
            # for the runtime's own user), else the user's home, else /.
            enter = (
                'cd -- "$1" || exit 1; exec "$0" -c "$2"'
                if params.cwd is not None
                else 'cd -- "$1" 2>/dev/null || cd -- "$3" 2>/dev/null || cd /; exec "$0" -c "$2"'
            )
            argv = [
                self._shell,
                "-c",
                enter,
                self._shell,
                cwd or CALLER_CWD.get() or identity.home or "/",
                params.command,
                identity.home or "/",
            ]
            cwd = "/"
        elif cwd is None:
            cwd = caller_cwd()  # where the call came from, never the server's own directory
        elif not os.path.isdir(cwd):
            raise ToolError(f"cwd {params.cwd!r} is not an existing directory")
        want_stdin = params.input is not None or params.stdin_open
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if want_stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,  # own process group: kill reaches every child
                user=identity.uid,
                group=identity.gid,
                extra_groups=identity.groups,
                limit=READ_SIZE,
            )
        except OSError as exc:
            raise ToolError(f"cannot start {params.command!r}: {exc.strerror or exc}") from None
        unprotect(process.pid)
        delivery = Delivery(self.limits.exec_buffer_bytes, self.limits.exec_response_bytes)
        handle = process.pid
        if handle in self._jobs or handle in self._remembered_results:
            # The kernel reused the pid of a job whose caller has not collected it yet
            # (an agent can cycle the pid space on purpose): that caller must never read
            # this job's output as its own, so this job gets a handle no pid can have.
            self._spare_handles += 1
            handle = PID_SPACE + self._spare_handles
        job = _Job(handle, process, delivery)
        self._jobs[job.pid] = job
        assert process.stdout is not None and process.stderr is not None
        readers = [
            asyncio.create_task(self._read(job, process.stdout, STDOUT)),
            asyncio.create_task(self._read(job, process.stderr, STDERR)),
        ]
        job.tasks = [*readers, asyncio.create_task(self._supervise(job, readers))]
        if params.input is not None:
            self._feed(job, params.input, params.stdin_open)
        return {"pid": job.pid}

    async def poll(self, params: PollParams) -> PollResult:
        job = self._job(params.pid)
        if job is None:
            return self._remembered(params.pid).poll_result()
        await job.acknowledge(params.ack_seq)
        if job.delivery.end_acknowledged(params.ack_seq):
            return self._release(job)
        if params.wait_ms and not job.delivery.has_news:
            with contextlib.suppress(asyncio.TimeoutError):
                async with job.changed:
                    await asyncio.wait_for(
                        job.changed.wait_for(lambda: job.delivery.has_news),
                        params.wait_ms / 1000,
                    )
        return job.delivery.poll_result()

    async def kill(self, params: AckParams) -> OutputResult:
        job = self._job(params.pid)
        if job is None:
            return self._remembered(params.pid).output()
        await job.acknowledge(params.ack_seq)
        if not job.delivery.finished and not job.kill_requested:
            job.kill_requested = True
            self._signal_group(job, signal.SIGTERM)
            job.tasks.append(asyncio.create_task(self._escalate(job)))
        return job.delivery.output()[0]

    async def write_stdin(self, params: WriteStdinParams) -> OutputResult:
        """Queue `data` for the process's stdin; return once its pipe has taken it.

        Bounded by `Limits.stdin_timeout_s` in all (waiting for other writes included).
        Input queued before (by `input` or an earlier write) must reach the pipe first:
        if it does not in time, nothing of `data` is queued and the error says so. If
        `data` itself is not taken in time, the error says how much of it is still
        queued: it reaches the process if it reads, and is dropped when it exits.
        """
        job = self._running_job(params.pid)
        await job.acknowledge(params.ack_seq)
        stdin = self._open_stdin(job)
        data = params.data.encode()
        timeout = self.limits.stdin_timeout_s
        queued = False

        async def write() -> None:
            nonlocal queued
            async with job.stdin_lock:
                await stdin.drain()  # what was queued before goes first
                if stdin.is_closing():
                    raise ToolError(f"stdin of process {job.pid} is already closed")
                stdin.write(data)
                queued = True
                await stdin.drain()

        try:
            await asyncio.wait_for(write(), timeout)
        except asyncio.TimeoutError:
            pending = _pending_stdin(stdin)
            if not queued:
                raise ToolError(
                    f"process {job.pid} did not read its stdin within {timeout:g} s: "
                    f"{pending} bytes written before are still waiting, so none of these "
                    f"{len(data)} bytes were sent; the process is not reading its input "
                    "(close_stdin or kill it, or write again later)"
                ) from None
            raise ToolError(
                f"process {job.pid} did not read its stdin within {timeout:g} s: "
                f"{pending} bytes are still queued for it (they reach it if it reads them, "
                "and are dropped when it exits); the process is not reading its input"
            ) from None
        except (BrokenPipeError, ConnectionResetError):
            raise ToolError(f"process {job.pid} closed its stdin") from None
        return job.delivery.output()[0]

    async def close_stdin(self, params: AckParams) -> OutputResult:
        """End the process's stdin; never waits for the process to read anything.

        Input still queued (an `input` or a write the process has not read yet) stays
        ahead of the end of file: it reaches the process if it reads it, and is dropped
        when the process exits or is killed. Closing twice, or after the process exited,
        is no error.
        """
        job = self._job(params.pid)
        if job is None:
            return self._remembered(params.pid).output()
        await job.acknowledge(params.ack_seq)
        stdin = job.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()  # EOF follows whatever is still queued; no await, no lock
        return job.delivery.output()[0]

    async def shutdown(self) -> None:
        """Kill every job's process group; the server is going away."""
        for job in list(self._jobs.values()):
            if not job.delivery.finished:
                job.kill_requested = True
                self._signal_group(job, signal.SIGKILL)
        for job in list(self._jobs.values()):
            _discard_stdin(job)
            for task in job.tasks:
                task.cancel()

    async def collect_garbage(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if job.finished_at is not None and now - job.finished_at > UNACKED_RESULT_TTL_S:
                self._release(job)

    # -- internals -----------------------------------------------------------------------

    def _job(self, pid: int) -> _Job | None:
        return self._jobs.get(pid)

    def _running_job(self, pid: int) -> _Job:
        job = self._job(pid)
        if job is None:
            self._remembered(pid)  # raises a precise error for unknown pids
            raise ToolError(f"process {pid} has already finished")
        if job.delivery.finished:
            raise ToolError(f"process {pid} has already finished")
        return job

    def _open_stdin(self, job: _Job) -> asyncio.StreamWriter:
        stdin = job.process.stdin
        if stdin is None:
            raise ToolError(
                f"process {job.pid} has no stdin to write to: start it with stdin_open: true"
            )
        if stdin.is_closing():
            raise ToolError(f"stdin of process {job.pid} is already closed")
        return stdin

    def _remembered(self, pid: int) -> FinalResult:
        """The end of a released job; for a pid with none, the error that explains it."""
        remembered = self._remembered_results.get(pid)
        if remembered is not None:
            return remembered
        # "No job found with pid N" is the phrase inspect_ai's client looks for to explain
        # a poll that timed out and lost a result.
        if self._lost_jobs_note:
            raise ToolError(
                f"No job found with pid {pid}: {self._lost_jobs_note}", ErrorReason.PROCESS_GONE
            )
        raise ToolError(
            f"No job found with pid {pid}: this runtime server did not start it "
            "(or its result was acknowledged long ago)",
            ErrorReason.PROCESS_GONE,
        )

    def _release(self, job: _Job) -> PollResult:
        final = job.delivery.final
        assert final is not None
        self._jobs.pop(job.pid, None)
        _discard_stdin(job)  # input a finished job never read is nobody's any more
        self._remembered_results[job.pid] = final
        while len(self._remembered_results) > REMEMBERED_RESULTS:
            self._remembered_results.popitem(last=False)
        return self._remembered(job.pid).poll_result()

    @staticmethod
    def _signal_group(job: _Job, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.process.pid, signum)

    async def _escalate(self, job: _Job) -> None:
        """SIGTERM was sent; whatever in the group survives the grace period is killed."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(job.process.wait(), self.limits.kill_grace_s)
        if job.process.returncode is None:
            self._signal_group(job, signal.SIGKILL)
            return
        # The leader is gone; any child left in its group still holds the group id.
        await asyncio.sleep(min(0.2, self.limits.kill_grace_s))
        self._signal_group(job, signal.SIGKILL)

    async def _read(self, job: _Job, stream: asyncio.StreamReader, name: Stream) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            await job.wait_for_space()
            data = await stream.read(READ_SIZE)
            text = decoder.decode(data, final=not data)
            if text:  # after the result, a straggler's output is dropped (by append)
                await job.append(name, text, len(data) or len(text))
            if not data:
                return

    @staticmethod
    def _feed(job: _Job, data: str, keep_open: bool) -> None:
        """Queue the start's `input` (then the end of file unless stdin stays open).

        Nothing waits for the process to read it: a task that held the stdin lock until
        the input drained once left write_stdin and close_stdin waiting forever for a
        process that never reads (`sleep 1000` given 10 MB).
        """
        stdin = job.process.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(data.encode())
            if not keep_open:
                stdin.close()  # after the queued input, as a file's end follows its data

    async def _supervise(self, job: _Job, readers: list[asyncio.Task[None]]) -> None:
        returncode = await job.process.wait()
        pending = set(readers)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=DRAIN_IDLE_S)
            if pending and time.monotonic() - job.last_output_at >= DRAIN_IDLE_S:
                # A background child still holds the pipes: finish the job, keep draining
                # (discarding nothing already read) until those pipes close by themselves.
                break
        job.delivery.finish(_exit_code(returncode), killed=job.kill_requested)
        job.finished_at = time.monotonic()
        await job.notify()
