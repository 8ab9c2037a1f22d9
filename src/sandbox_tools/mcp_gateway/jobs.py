"""exec_start's jobs as the gateway keeps them between a model's polls.

A job is the host library's `ExecRemoteProcess`, read through its `batches()`: each batch
is what one long poll of the runtime brought, acknowledged by the next. A tool call may
wait for news only so long (`wait_ms`), so the request for the next batch runs on between
calls, and a call takes it once it is there. What a batch brought is shown in order, at
most `budget` characters per answer; the rest waits for the next call, and the next batch
is asked for only once all of it was shown. So the host holds at most one batch per job
(the runtime sends at most 2 MiB a poll), and a process printing faster than the model
reads is paused by the runtime (its 8 MiB buffer), never buffered on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from sandbox_tools.errors import RefusedToolCall, RuntimeTransportError
from sandbox_tools.injector.exec_remote import (
    Completed,
    ExecEvent,
    ExecRemoteProcess,
    StderrChunk,
    StdoutChunk,
)

# How long closing a job may wait for its poll to let go (the kill is bounded on its own).
RELEASE_TIMEOUT = 5.0


@dataclass(frozen=True)
class Taken:
    """What one answer shows of a job: its output in order, and whether more waits."""

    stdout: str
    stderr: str
    waiting: int  # characters already on the host, not shown yet


def take(unread: deque[StdoutChunk | StderrChunk], budget: int) -> Taken:
    """Up to `budget` characters off the front of `unread` (a chunk that does not fit is
    split, its rest kept at the front), joined per stream."""
    stdout: list[str] = []
    stderr: list[str] = []
    left = budget
    while unread and left > 0:
        chunk = unread.popleft()
        shown, rest = chunk.data[:left], chunk.data[left:]
        if rest:
            unread.appendleft(type(chunk)(rest))
        (stdout if isinstance(chunk, StdoutChunk) else stderr).append(shown)
        left -= len(shown)
    return Taken("".join(stdout), "".join(stderr), sum(len(c.data) for c in unread))


@dataclass(frozen=True)
class JobReport:
    """One answer about a job: what it printed since the last one, and where it stands."""

    pid: int
    taken: Taken
    completed: Completed | None  # set once the end is shown (all output before it was)

    @property
    def state(self) -> str:
        if self.completed is None:
            return "running"
        return "killed" if self.completed.killed else "completed"


class Job:
    """A job of one sandbox, from exec_start until its end and all its output were shown."""

    def __init__(self, process: ExecRemoteProcess, *, max_batch_chars: int) -> None:
        self.process = process
        self.max_batch_chars = max_batch_chars
        self._batches: AsyncGenerator[list[ExecEvent], None] = process.batches()
        self._next: asyncio.Task[list[ExecEvent]] | None = None
        self._unread: deque[StdoutChunk | StderrChunk] = deque()
        self._completed: Completed | None = None
        self._lost = False  # a poll failed (the runtime lost the job, or stopped answering)
        self.lock = asyncio.Lock()  # one reader at a time: each answer shows what it took

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def done(self) -> bool:
        """Its end and all its output were shown, or a poll failed (and said why): the
        sandbox forgets it."""
        return self._lost or (self._completed is not None and not self._unread)

    async def read(self, wait: float, budget: int) -> JobReport:
        """What the job printed since the last answer (waiting up to `wait` seconds for
        news if nothing is waiting on the host), at most `budget` characters of it."""
        if not self._unread and self._completed is None:
            await self._fetch(wait)
        taken = take(self._unread, budget)
        return JobReport(self.pid, taken, self._completed if not self._unread else None)

    async def stream(
        self, wait: float, budget: int, progress: Callable[[str], Awaitable[None]]
    ) -> JobReport:
        """Like `read`, but for the whole `wait` (or until the job ends, or `budget`
        characters were shown): each piece of output goes to `progress` as it comes, and
        the answer holds all of them, so a client that shows no progress loses nothing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        stdout: list[str] = []
        stderr: list[str] = []
        left = budget
        while True:
            report = await self.read(max(0.0, deadline - loop.time()), left)
            taken = report.taken
            if taken.stdout or taken.stderr:
                await progress(taken.stdout + taken.stderr)
                stdout.append(taken.stdout)
                stderr.append(taken.stderr)
                left -= len(taken.stdout) + len(taken.stderr)
            if report.completed is not None or left <= 0 or loop.time() >= deadline:
                break
        shown = Taken("".join(stdout), "".join(stderr), report.taken.waiting)
        return JobReport(self.pid, shown, report.completed)

    async def _fetch(self, wait: float) -> None:
        if self._next is None:
            self._next = asyncio.create_task(self._next_batch())
        fetched = self._next
        done, _ = await asyncio.wait({fetched}, timeout=wait)
        if not done:
            return  # still running silently: the same request is taken up by the next call
        if self._next is fetched:
            self._next = None
        if fetched.cancelled():  # close() took it from under this call
            raise RefusedToolCall(f"job {self.pid} is no longer read: its sandbox was closed")
        try:
            events = fetched.result()
        except StopAsyncIteration:  # its events ended before: nothing more will come
            self._lost = True
            raise RefusedToolCall(f"job {self.pid} has no more output") from None
        except Exception:  # a transport or tool error reaches the caller, said once
            self._lost = True
            raise
        for event in events:
            if isinstance(event, Completed):
                self._completed = event
            else:
                self._unread.append(event)

    async def _next_batch(self) -> list[ExecEvent]:
        """The next poll's events, refused (and the job ended) if they carry more than
        the runtime ever sends in one answer: then the runtime is not ours, and the host
        does not hold what it sent."""
        events = await anext(self._batches)
        size = sum(len(e.data) for e in events if isinstance(e, (StdoutChunk, StderrChunk)))
        if size > self.max_batch_chars:
            del events
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.process.kill(), RELEASE_TIMEOUT)
            raise RuntimeTransportError(
                f"job {self.pid}: one poll brought {size:,} characters of output, more than "
                f"sandbox-tools' runtime ever sends ({self.max_batch_chars:,}); the runtime "
                "in this sandbox is not ours, so the job is dropped: close the sandbox"
            )
        return events

    async def kill(self, wait: float, budget: int) -> JobReport:
        """Kill the job's process group and report its end, with the output no answer
        showed yet (a kill's own answer repeats what the next poll delivers, so the
        output is read from the polls alone)."""
        if self._completed is None:
            await self.process.kill()
            deadline = asyncio.get_running_loop().time() + wait
            while self._completed is None:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                await self._fetch(left)
        return await self.read(0, budget)

    async def close(self, *, kill: bool = True) -> None:
        """Stop reading the job: its process killed if it still runs (bounded; `kill`
        false: its container is gone already), the poll in flight dropped."""
        if self._completed is None and kill:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.process.kill(), RELEASE_TIMEOUT)
        pending, self._next = self._next, None
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending}, timeout=RELEASE_TIMEOUT)
            if pending.done() and not pending.cancelled():
                pending.exception()  # retrieved: an error here is nobody's any more
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._batches.aclose(), RELEASE_TIMEOUT)
