"""The MCP gateway's jobs (exec_start / exec_poll / exec_kill between a model's calls)
against the real runtime server in the test's own process: output shown in bounded
pieces and in order, the end reported only once all output before it was shown, a poll
that waits for a silent job left running between calls, a kill while that poll is in
flight, and a close that drops it. No container: the answers are the runtime's own."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from sandbox_tools.errors import RefusedToolCall, RuntimeTransportError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, start_exec_remote
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.mcp_gateway.jobs import Job
from sandbox_tools.mcp_gateway.registry import (
    MAX_BATCH_CHARS,
    MAX_CALLS_IN_FLIGHT,
    MAX_JOBS_PER_SANDBOX,
    GatewaySandbox,
    Sandboxes,
)
from sandbox_tools.mcp_gateway.tools import call_tool
from sandbox_tools.protocol import MAX_JOBS_ENV
from sandbox_tools.sandboxes.containers import ContainerPolicy
from tests.support import InProcessRuntime, serve_runtime_in_process

OPTIONS = ExecRemoteOptions(poll_interval=1.0)


async def job_of(
    runtime: InProcessRuntime, command: str, max_batch_chars: int = MAX_BATCH_CHARS
) -> Job:
    return Job(
        await start_exec_remote(runtime.client, command, OPTIONS), max_batch_chars=max_batch_chars
    )


async def test_output_comes_in_bounded_pieces_and_the_end_after_all_of_it(
    runtime_in_process: InProcessRuntime,
) -> None:
    job = await job_of(runtime_in_process, "printf 0123456789; printf abc >&2; exit 4")
    shown_out = shown_err = ""
    for _ in range(50):
        report = await job.read(wait=5, budget=4)
        assert len(report.taken.stdout) + len(report.taken.stderr) <= 4
        shown_out += report.taken.stdout
        shown_err += report.taken.stderr
        if report.completed is not None:
            break
        assert report.state == "running"
    assert (shown_out, shown_err) == ("0123456789", "abc")
    assert report.completed is not None and report.completed.exit_code == 4
    assert report.state == "completed" and report.taken.waiting == 0 and job.done


async def test_a_silent_job_is_answered_within_the_wait_and_read_on_later(
    runtime_in_process: InProcessRuntime,
) -> None:
    job = await job_of(runtime_in_process, "sleep 1; echo late")
    started = asyncio.get_running_loop().time()
    first = await job.read(wait=0.2, budget=100)
    assert asyncio.get_running_loop().time() - started < 1.0
    assert first.state == "running" and not first.taken.stdout
    said = ""
    while not job.done:
        said += (await job.read(wait=5, budget=100)).taken.stdout
    assert said == "late\n"


async def test_a_kill_while_a_poll_is_in_flight_reports_the_end_once(
    runtime_in_process: InProcessRuntime,
) -> None:
    job = await job_of(runtime_in_process, "echo started; exec sleep 1000")
    assert "started" in (await job.read(wait=5, budget=100)).taken.stdout
    assert (await job.read(wait=0.1, budget=100)).state == "running"  # leaves a poll running
    report = await job.kill(wait=10, budget=100)
    assert report.state == "killed" and report.completed is not None and job.done
    assert not report.taken.stdout  # "started" was shown already: never twice


async def test_closing_a_job_kills_it_and_a_reader_waiting_on_it_is_told(
    runtime_in_process: InProcessRuntime,
) -> None:
    job = await job_of(runtime_in_process, "exec sleep 1000")
    reading = asyncio.create_task(job.read(wait=30, budget=100))
    await asyncio.sleep(0.3)
    await job.close()
    with pytest.raises(RefusedToolCall, match="no longer read: its sandbox was closed"):
        await reading
    # The process is gone: killed, and reaped by the runtime (a zombie answers kill -0,
    # so a loaded machine may take a moment to reap it).
    for _ in range(100):
        checked = await start_exec_remote(runtime_in_process.client, f"kill -0 {job.pid}")
        if (await checked.wait()).exit_code != 0:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"job {job.pid} still runs 10 s after its sandbox closed it")


async def test_a_poll_larger_than_the_runtime_ever_sends_ends_the_job_and_is_not_kept(
    runtime_in_process: InProcessRuntime,
) -> None:
    """A runtime that is not ours (an agent root in its sandbox can serve its own on the
    socket) answered a poll with 60 MiB, which the host held per job without bound. The
    host's bound here is set below what this real runtime sends, to stand for it."""
    job = await job_of(runtime_in_process, "head -c 5000 /dev/zero | tr '\\0' x", 1000)
    with pytest.raises(RuntimeTransportError, match="more than sandbox-tools' runtime ever"):
        for _ in range(20):
            await job.read(wait=5, budget=100)
    assert job.done and not job._unread


def _held(runtime: InProcessRuntime, sandbox_id: str) -> GatewaySandbox:
    """A sandbox of the gateway over the in-process runtime (no container: the job
    bounds are the host's, whatever the runtime keeps)."""
    support: Any = type("Support", (), {"client": runtime.client})()
    return GatewaySandbox(sandbox_id, cast(Any, None), support, "in-process", None)


async def test_the_host_bounds_the_jobs_it_reads_whatever_the_runtime_allows() -> None:
    async with serve_runtime_in_process({MAX_JOBS_ENV: "1000"}) as runtime:
        sandboxes = Sandboxes(_no_engine, InjectionOptions(), ContainerPolicy())
        held = _held(runtime, "sbx-jobs")
        sandboxes._by_id[held.id] = held
        options = ExecRemoteOptions(poll_interval=1.0)
        started = await asyncio.gather(
            *(
                sandboxes.start_job(held, "sleep 1000", options)
                for _ in range(MAX_JOBS_PER_SANDBOX + 5)
            ),
            return_exceptions=True,
        )
        refused = [r for r in started if isinstance(r, RefusedToolCall)]
        assert len(held.jobs) == MAX_JOBS_PER_SANDBOX and len(refused) == 5
        assert f"has {MAX_JOBS_PER_SANDBOX} jobs already" in refused[0].message
        await asyncio.gather(*(job.close() for job in held.jobs.values()))


def _no_engine() -> Any:
    raise AssertionError("no engine here")


async def test_a_streamed_poll_reports_each_piece_as_it_comes_and_answers_with_all(
    runtime_in_process: InProcessRuntime,
) -> None:
    job = await job_of(runtime_in_process, "for i in 1 2 3; do echo line $i; sleep 0.4; done")
    pieces: list[str] = []

    async def progress(text: str) -> None:
        pieces.append(text)

    report = await job.stream(wait=20, budget=1000, progress=progress)
    assert len(pieces) >= 2, pieces  # the lines came apart in time, and so did the news
    assert "".join(pieces) == report.taken.stdout == "line 1\nline 2\nline 3\n"
    assert report.completed is not None and report.state == "completed"


class _Wedged:
    """A sandbox's browser whose server never answers (the second attacker walk's forged
    browser-mcp), standing in for the relay."""

    async def call(self, name: str, arguments: dict[str, Any], text_limit: int) -> Any:
        await asyncio.Event().wait()

    async def close(self, timeout: float = 0) -> None:
        return None


async def test_a_sandbox_whose_calls_never_end_holds_up_no_other_sandbox(
    runtime_in_process: InProcessRuntime,
) -> None:
    sandboxes = Sandboxes(_no_engine, InjectionOptions(), ContainerPolicy())
    wedged, healthy = _held(runtime_in_process, "sbx-wedged"), _held(runtime_in_process, "sbx-ok")
    wedged._browser = cast(Any, _Wedged())
    for held in (wedged, healthy):
        sandboxes._by_id[held.id] = held
    stuck = [
        asyncio.create_task(call_tool(sandboxes, "browser_snapshot", {"sandbox": wedged.id}))
        for _ in range(MAX_CALLS_IN_FLIGHT)
    ]
    await asyncio.sleep(0.2)
    started = await asyncio.wait_for(
        call_tool(sandboxes, "exec_start", {"sandbox": healthy.id, "command": "echo ok"}), 10
    )
    assert not started.is_error, started.text
    assert not any(task.done() for task in stuck)  # still waiting on the wedged one
    for task in stuck:
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)
    await asyncio.gather(*(job.close() for job in healthy.jobs.values()))
