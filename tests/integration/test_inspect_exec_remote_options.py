"""inspect's exec_remote options through ours, each with inspect's meaning.

- `poll_timeout`, `poll_timeout_retry`, `poll_timeout_recovery`: a real `inspect eval`
  (docker_sdk sandbox) drives `sandbox_tools.inspect.exec_remote` while our runtime's
  server in the container is stopped (SIGSTOP) for a while, as a stalled sandbox is.
- `concurrency`: inspect's real `local` sandbox with its subprocess limit at 1, held by
  another subprocess: calls made with `concurrency=False` are not held behind it.
- `timeout_retry` of our inspect sandbox environments (ProviderEnvironment, here as
  `docker_sdk`): a real
  container whose engine gives no exec slot in time is retried; an overrun is not.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import run_inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

TASK = textwrap.dedent(
    """
    import asyncio, time

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import ExecRemoteStreamingOptions as Options, sandbox

    from sandbox_tools.inspect import exec_remote
    from sandbox_tools.inspect.tools import runtime_for

    # "b" comes 2 s after "a", while the runtime's server is stopped.
    CMD = ["sh", "-c", "echo a; sleep 2; echo b; exec sleep 300"]


    async def signal_server(pid, name):
        done = await sandbox().exec(["sh", "-c", f"kill -{name} {pid}"], user="root")
        assert done.success, (done.returncode, done.stderr)


    async def resume_after(pid, seconds):
        await asyncio.sleep(seconds)
        await signal_server(pid, "CONT")


    async def stalled(pid, options, stop_for=None):
        # What the next event is when the server stops right after the first one, for
        # `stop_for` seconds (None: until the next event or error), and how long it took.
        proc = await exec_remote(CMD, options)
        events = aiter(proc)
        first = await anext(events)
        await signal_server(pid, "STOP")
        resume = asyncio.create_task(resume_after(pid, stop_for or 0))
        if stop_for is None:
            resume.cancel()
        started = time.monotonic()
        try:
            outcome = ["event", (await anext(events)).data]
        except TimeoutError as exc:
            outcome = ["TimeoutError", str(exc)]
        elapsed = time.monotonic() - started
        if stop_for is None:
            await signal_server(pid, "CONT")
        else:
            await resume
        await proc.kill()
        return {"first": first.data, "outcome": outcome, "seconds": round(elapsed, 2)}


    @solver
    def options_under_a_stalled_server():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            support, _ = await runtime_for()
            pid = (await support.client.call("runtime_info"))["pid"]
            no_retry = Options(poll_timeout=3, poll_timeout_retry=False)
            r = {"poll_timeout": await stalled(pid, no_retry)}
            r["retry_default"] = await stalled(pid, Options(poll_timeout=3), 4)
            r["retry_false"] = await stalled(pid, no_retry, 4)
            recover = Options(poll_timeout=2, poll_timeout_recovery=30)
            r["recovery"] = await stalled(pid, recover, 8)
            r["no_recovery"] = await stalled(pid, Options(poll_timeout=2), 8)
            state.store.set("results", r)
            return state

        return solve


    @task
    def exec_remote_options():
        return Task(dataset=[Sample(input="stall")], solver=options_under_a_stalled_server())
    """
)


@pytest.mark.docker
def test_poll_timeout_retry_and_recovery_take_effect_with_inspects_meaning(
    python_image: str, built_artifacts: Any, tmp_path: Path
) -> None:
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    task_file = tmp_path / "options_task.py"
    task_file.write_text(TASK)
    config = tmp_path / "sandbox.json"
    config.write_text(json.dumps({"image": python_image}))
    env = {"SANDBOX_TOOLS_DIST": str(artifact.parent)}
    sample, _log = run_inspect_eval(task_file, "--sandbox", f"docker_sdk:{config}", env=env)
    r = sample["store"]["results"]
    for case in r.values():
        assert case["first"] == "a\n", r

    # poll_timeout=3: the poll gives up after 3 s (then the process is killed, bounded by
    # 5 s), not after our default bound of the poll's wait plus 15 s.
    timed_out = r["poll_timeout"]
    assert timed_out["outcome"][0] == "TimeoutError", r
    assert "within 3 s" in timed_out["outcome"][1], r
    assert 3 <= timed_out["seconds"] < 9, r

    # poll_timeout_retry left None is inspect's default (retried): a 4 s stall outlives
    # the first 3 s poll, the poll sent again gets "b". False: TimeoutError after 3 s.
    assert r["retry_default"]["outcome"] == ["event", "b\n"], r
    assert 4 <= r["retry_default"]["seconds"] < 7, r
    assert r["retry_false"]["outcome"][0] == "TimeoutError", r

    # poll_timeout_recovery=30: an 8 s stall outlives the poll and its two retries (2, 2
    # and 1 s); the poll re-sent 5 s later replays "b". Without it: TimeoutError.
    assert r["recovery"]["outcome"] == ["event", "b\n"], r
    assert 8 <= r["recovery"]["seconds"] < 16, r
    assert r["no_recovery"]["outcome"][0] == "TimeoutError", r


async def test_concurrency_false_is_not_held_by_inspects_subprocess_limit(
    runtime_dir: Any,
) -> None:
    """Every call to the runtime is an exec of the inspect sandbox: with `concurrency`
    (inspect's default) it waits for inspect's subprocess limit, without it does not."""
    from inspect_ai.util import subprocess
    from inspect_ai.util._sandbox.local import LocalSandboxEnvironment
    from inspect_ai.util._subprocess import init_max_subprocesses

    from sandbox_tools.injector.exec_remote import ExecRemoteOptions, start_exec_remote
    from sandbox_tools.injector.jsonrpc_client import ExecRuntimeClient
    from sandbox_tools.injector.source_runtime import local_source_runtime
    from sandbox_tools.inspect.adapter import InspectSandbox
    from sandbox_tools.inspect.tools import _client

    init_max_subprocesses(1)
    launch = local_source_runtime(runtime_dir.path)
    environment = LocalSandboxEnvironment()
    client = ExecRuntimeClient(InspectSandbox(environment), launch.command, env=launch.env)
    try:
        await client.call("version")  # the server is up before the limit is held

        async def run(concurrency: bool) -> float:
            holder = asyncio.create_task(subprocess(["sleep", "4"]))  # the one subprocess
            await asyncio.sleep(0.5)
            started = time.monotonic()
            process = await start_exec_remote(
                _client(client, concurrency), "echo hi", ExecRemoteOptions(poll_interval=0.5)
            )
            assert (await process.wait()).stdout == "hi\n"
            elapsed = time.monotonic() - started
            await holder
            return elapsed

        assert await run(concurrency=False) < 2
        assert await run(concurrency=True) > 3  # held until the sleep ended
    finally:
        await client.aclose()
        environment.directory.cleanup()


@pytest.mark.docker
async def test_provider_exec_timeout_retry_reruns_only_what_the_engine_timed_out(
    python_container: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inspect's docker sandbox retries a command when its docker CLI hung, never one
    that ran past its timeout. Ours: the engine gave no exec slot within its deadline
    (2 s here, one slot held for 3 s) is retried; an overrun is not."""
    import docker

    from sandbox_tools.inspect.docker_env import DockerSdkSandboxEnvironment
    from sandbox_tools.sandboxes import docker_api
    from sandbox_tools.sandboxes.docker import DockerSandbox

    monkeypatch.setattr(docker_api, "SLOT_TIMEOUT", 2.0)
    client = docker.from_env()  # its own EngineAPI, made with the short deadline
    api = docker_api.engine_api(client)
    api.concurrency = 1
    # The docker_sdk sandbox environment: a ProviderEnvironment on our Docker provider.
    environment = DockerSdkSandboxEnvironment(DockerSandbox(str(python_container.id), client))

    async def slot_held_for(seconds: float) -> asyncio.Task[None]:
        async def hold() -> None:
            async with api.slot():
                await asyncio.sleep(seconds)

        task = asyncio.create_task(hold())
        await asyncio.sleep(0.2)
        return task

    try:
        holder = await slot_held_for(3)
        started = time.monotonic()
        result = await environment.exec(["echo", "ran"], timeout=20)  # timeout_retry=True
        assert result.stdout == "ran\n"
        assert 2.5 < time.monotonic() - started < 8  # the first attempt timed out at 2 s
        await holder

        holder = await slot_held_for(3)
        with pytest.raises(TimeoutError, match="slot"):
            await environment.exec(["echo", "ran"], timeout=20, timeout_retry=False)
        await holder

        overrun = ["sh", "-c", "echo x >> /tmp/runs; sleep 5"]
        with pytest.raises(TimeoutError):
            await environment.exec(overrun, timeout=1)
        assert (await environment.exec(["cat", "/tmp/runs"])).stdout == "x\n"  # ran once
    finally:
        client.close()
