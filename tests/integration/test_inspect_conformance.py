"""Conformance: inspect_ai's own host code drives our built runtime.

Our artifact is put where inspect_ai looks for a locally built runtime of its own
(`inspect_ai/binaries/inspect-sandbox-tools-<arch>-v<N>-dev`, chosen when
INSPECT_SANDBOX_TOOLS_INSTALL_STATE=edited), so inspect's unmodified injection, its
transport (with response chunking), its `exec_remote`, `bash_session()` and
`text_editor()` run against our runtime in a real `inspect eval`: with inspect's `local`
sandbox, and with a Docker container whose default user is a uid with no passwd entry
(inspect then sends that identity as an object on every call).

Proven against the inspect-ai version pinned in constraints-dev.txt (asserted below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import run_inspect_eval

inspect_ai = pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

PROVEN_INSPECT_VERSION = "0.3.285"
# inspect's fixed install location (inspect_ai/util/_sandbox/_cli.py), cleaned around tests
# that use the `local` sandbox, where it is on this machine.
INSPECT_TOOLS_DIR = Path("/var/tmp/.da7be258e003d428")
INSPECT_CLI = INSPECT_TOOLS_DIR / "inspect-sandbox-tools"
# Other modules use this machine as the sandbox too (one of them empties that directory).
pytestmark = pytest.mark.usefixtures("this_host_as_sandbox")

TASK = textwrap.dedent(
    """
    import asyncio, json, os

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.tool import bash_session, text_editor
    from inspect_ai.util import (
        ExecCompleted, ExecRemoteStreamingOptions, ExecStderr, ExecStdout, sandbox,
    )

    WORK = os.environ["CONFORMANCE_WORK"]
    CLI = "/var/tmp/.da7be258e003d428/inspect-sandbox-tools"
    # Killed 1.5 s after the start, before any poll: what it printed comes, its TERM trap's
    # output never (nothing polls after a kill); killed after it exited by itself.
    KILLED = {
        "trapped": ["sh", "-c", "trap 'echo bye; exit 0' TERM; echo up; "
                    "while :; do sleep 0.1; done"],
        "exited": ["sh", "-c", "echo done; exit 3"],
    }


    async def events(proc):
        seen = []
        async for event in proc:
            if isinstance(event, ExecStdout):
                seen.append(["stdout", event.data])
            elif isinstance(event, ExecStderr):
                seen.append(["stderr", event.data])
            elif isinstance(event, ExecCompleted):
                seen.append(["completed", event.exit_code])
        return seen


    async def gone(pid):
        await asyncio.sleep(1)
        probe = f"kill -0 {pid} 2>/dev/null && echo alive || echo gone"
        return (await sandbox().exec(["sh", "-c", probe])).stdout


    # What the iterator yields after kill(), for processes started by `start` (inspect's
    # own sandbox().exec_remote, or ours).
    async def after_kill(start):
        seen = {}
        for name, cmd in KILLED.items():
            proc = await start(cmd)
            await asyncio.sleep(1.5)
            await proc.kill()
            seen[name] = await events(proc)
        # Killed from inside the loop, at its first event.
        proc = await start(["sh", "-c", "echo one; exec sleep 300"])
        await asyncio.sleep(1)
        in_loop = []
        async for event in proc:
            in_loop.append([event.type, getattr(event, "data", None)])
            if len(in_loop) == 1:
                await proc.kill()
        seen["in_loop"] = in_loop
        seen["in_loop_process"] = await gone(proc.pid)
        return seen


    @solver
    def drive_inspects_own_tools():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            sb, r = sandbox(), {}
            await sb.exec(["mkdir", "-p", WORK])
            three = ["sh", "-c", "echo out; echo err >&2; exit 3"]
            done = await sb.exec_remote(three, stream=False)
            r["awaitable"] = [done.returncode, done.stdout, done.stderr]
            proc = await sb.exec_remote(["cat"], ExecRemoteStreamingOptions(stdin_open=True))
            await proc.write_stdin("fed through stdin\\n")
            await proc.close_stdin()
            r["stdin"] = await events(proc)
            sleeper = await sb.exec_remote(["sleep", "300"])
            await sleeper.kill()
            await asyncio.sleep(1)
            probe = f"kill -0 {sleeper.pid} 2>/dev/null && echo alive || echo gone"
            r["killed"] = (await sb.exec(["sh", "-c", probe])).stdout
            r["after_kill"] = {"inspect": await after_kill(sb.exec_remote)}
            if os.environ.get("CONFORMANCE_OURS"):  # ours, side by side, in the same sandbox
                from sandbox_tools.inspect import exec_remote

                r["after_kill"]["ours"] = await after_kill(exec_remote)

            bash = bash_session()
            r["bash"] = [
                await bash(action="type_submit", input=f"cd {WORK} && X=41"),
                await bash(action="type_submit", input="echo $((X+1)) $PWD; id -u"),
            ]

            edit = text_editor()
            notes, big = f"{WORK}/notes.txt", f"{WORK}/big.txt"
            await edit(command="create", path=notes, file_text="alpha\\nbeta\\n")
            await edit(command="str_replace", path=notes, old_str="beta", new_str="gamma")
            await edit(command="insert", path=notes, insert_line=1, new_str="inserted")
            r["after_insert"] = await edit(command="view", path=notes)
            await edit(command="undo_edit", path=notes)
            r["after_undo"] = await edit(command="view", path=notes)
            # Over 64 KiB in one request, and a view over the chunking limit (32 KiB here).
            text = "".join(f"row {n} " + "\\u00e9" * 60 + "\\n" for n in range(1500))
            await edit(command="create", path=big, file_text=text)
            r["big_view"] = await edit(command="view", path=big, view_range=[1, 200])
            r["big_expected"] = "".join(
                f"{n + 1:6}\\t{line}\\n" for n, line in enumerate(text.splitlines()[:200])
            )
            info = await sb.exec(
                [CLI, "exec"],
                input=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "runtime_info"}),
                user=os.environ.get("CONFORMANCE_CLI_USER"),  # the tools' own user
            )
            r["runtime_info"] = json.loads(info.stdout)["result"]
            owners = await sb.exec(["stat", "-c", "%u", notes, big])
            r["owners"] = owners.stdout.split()
            state.store.set("results", r)
            return state

        return solve


    @task
    def conformance():
        return Task(dataset=[Sample(input="drive")], solver=drive_inspects_own_tools())
    """
)


@pytest.fixture
def our_runtime_as_inspects(built_artifacts: Any) -> Iterator[Any]:
    from sandbox_tools.inspect.dropin import as_inspect_dev_runtime

    arch = Arch.parse(os.uname().machine)
    record, artifact = built_artifacts(arch)
    with as_inspect_dev_runtime(artifact, arch):
        yield record


def _run_eval(tmp_path: Path, sandbox: str, extra_env: dict[str, str]) -> dict[str, Any]:
    task_file = tmp_path / "conformance_task.py"
    task_file.write_text(TASK)
    env = {
        "INSPECT_SANDBOX_TOOLS_INSTALL_STATE": "edited",  # use the -dev runtime: ours
        "INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE": "32768",  # small, so responses get chunked
        **extra_env,
    }
    options = ["--model", "mockllm/model", "--sandbox", sandbox]
    sample, log_file = run_inspect_eval(task_file, *options, env=env)
    results: dict[str, Any] = sample["store"]["results"]
    results["_log_text"] = log_file.read_text()
    return results


def _check_every_tool(r: dict[str, Any], record: Any, uid: str, work: str) -> None:
    assert r["runtime_info"]["build_id"] == record.build_id  # ours answered, not inspect's
    assert r["awaitable"] == [3, "out\n", "err\n"]
    assert r["stdin"] == [["stdout", "fed through stdin\n"], ["completed", 0]]
    assert r["killed"] == "gone\n"
    # After kill(): the output no poll had delivered, no ExecCompleted, and the end.
    assert r["after_kill"]["inspect"] == AFTER_KILL
    assert r["bash"][1] == f"42 {work}\n{uid}\n"
    assert r["after_insert"].endswith("     1\talpha\n     2\tinserted\n     3\tgamma\n")
    assert r["after_undo"].endswith("     1\talpha\n     2\tgamma\n")
    assert r["big_view"].endswith(r["big_expected"])
    assert len(json.dumps(r["big_view"])) > 32768  # as it travels: over the limit
    assert r["owners"] == [uid, uid]
    # The view came back in pieces through inspect's continuation exchange.
    assert "__inspect_json_rpc_response_chunk__" in r["_log_text"]


AFTER_KILL = {
    "trapped": [["stdout", "up\n"]],
    "exited": [["stdout", "done\n"]],
    "in_loop": [["stdout", "one\n"]],
    "in_loop_process": "gone\n",
}


def test_inspect_version_is_the_proven_one() -> None:
    assert inspect_ai.__version__ == PROVEN_INSPECT_VERSION, (
        "constraints-dev.txt pins the inspect-ai this suite proves; update both together"
    )


@pytest.fixture
def clean_local_tools_dir(tmp_path: Path) -> Iterator[None]:
    """inspect's tools directory emptied before and after; the server the test started
    (in its own server directory, tmp_path/srv) stopped after it, not left running."""
    shutil.rmtree(INSPECT_TOOLS_DIR, ignore_errors=True)
    yield
    subprocess.run(
        [str(INSPECT_CLI), "stop-server"],
        env={**os.environ, "SANDBOX_TOOLS_DIR": str(tmp_path / "srv")},
        capture_output=True,
        timeout=60,
        check=False,
    )
    shutil.rmtree(INSPECT_TOOLS_DIR, ignore_errors=True)


def test_inspects_own_tools_run_on_our_runtime_in_a_local_sandbox(
    our_runtime_as_inspects: Any, clean_local_tools_dir: None, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    server_dir = tmp_path / "srv"
    env = {"CONFORMANCE_WORK": str(work), "SANDBOX_TOOLS_DIR": str(server_dir)}
    results = _run_eval(tmp_path, "local", env)
    _check_every_tool(results, our_runtime_as_inspects, str(os.geteuid()), str(work))


@pytest.mark.docker
def test_inspects_own_tools_run_on_our_runtime_in_a_docker_sandbox_as_a_uid_without_passwd(
    our_runtime_as_inspects: Any, built_artifacts: Any, python_image: str, tmp_path: Path
) -> None:
    """The container's default user is 4242:4242, which has no passwd entry: inspect sends
    {uid, gid, groups, home} with every call and our runtime, started as root, switches.

    Our own `sandbox_tools.inspect.exec_remote` runs the kill cases beside inspect's, in
    the same sandbox: its iterator must yield exactly what inspect's does."""
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    config = tmp_path / "sandbox.json"
    config.write_text(json.dumps({"image": python_image, "user": "4242:4242"}))
    results = _run_eval(
        tmp_path,
        f"docker_sdk:{config}",
        {
            "CONFORMANCE_WORK": "/tmp/work-4242",
            "CONFORMANCE_CLI_USER": "root",
            "CONFORMANCE_OURS": "1",
            "SANDBOX_TOOLS_DIST": str(artifact.parent),
        },
    )
    _check_every_tool(results, our_runtime_as_inspects, "4242", "/tmp/work-4242")
    assert results["after_kill"]["ours"] == results["after_kill"]["inspect"] == AFTER_KILL
