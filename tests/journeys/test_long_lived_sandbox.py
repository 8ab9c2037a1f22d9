"""User journey: many samples in a row on a sandbox that outlives each of them
(inspect's `local` sandbox: this machine), with inspect's own host code driving our
runtime and with our tools. One runtime server serves them all.

Each sample runs exec_remote (no cwd: it must start in the sample's directory, which
the previous sample's cleanup deleted for that sample), a bash session and the text
editor. Before, every exec_remote after the first sample carried a `getcwd` error, and
the 17th sample was refused a bash session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import eval_samples, inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
# docker: the artifact is built. This machine is the sandbox, whose install directory
# and server other modules share, and inspect's tools directory, which one of them empties.
pytestmark = [
    pytest.mark.journey,
    pytest.mark.docker,
    pytest.mark.usefixtures("this_host_as_sandbox"),
]

SAMPLES = 20
INSPECT_TOOLS_DIR = Path("/var/tmp/.da7be258e003d428")  # where inspect installs its CLI

TASK = textwrap.dedent(
    """
    import os

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import sandbox

    OURS = os.environ["JOURNEY_TOOLS"] == "ours"
    if OURS:
        from sandbox_tools.inspect import bash_session, exec_remote, text_editor
    else:
        from inspect_ai.tool import bash_session, text_editor


    async def run_remote(cmd):
        if OURS:
            return await exec_remote(cmd, stream=False)
        return await sandbox().exec_remote(cmd, stream=False)


    @solver
    def every_tool():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            here = (await sandbox().exec(["pwd"])).stdout.strip()
            remote = await run_remote(["sh", "-c", "pwd; echo ok"])
            shell = bash_session()
            typed = await shell(action="type_submit", input="echo $((6 * 7))")
            editor = text_editor()
            path = f"{here}/note.txt"
            await editor(command="create", path=path, file_text="hello\\n")
            viewed = await editor(command="view", path=path)
            state.store.set("seen", {
                "here": here, "stdout": remote.stdout, "stderr": remote.stderr,
                "bash": str(typed), "view": str(viewed),
            })
            return state

        return solve


    @scorer(metrics=[accuracy()])
    def all_worked():
        async def score(state: TaskState, target: Target) -> Score:
            seen = state.store.get("seen")
            ok = (
                seen["stdout"] == seen["here"] + "\\nok\\n"
                and seen["stderr"] == ""
                and "42" in seen["bash"]
                and seen["view"].endswith("1\\thello\\n")
            )
            return Score(value=CORRECT if ok else INCORRECT, explanation=repr(seen))

        return score


    @task
    def many():
        return Task(
            dataset=[Sample(input=str(n), id=n) for n in range(1, __SAMPLES__ + 1)],
            solver=every_tool(),
            scorer=all_worked(),
            sandbox="local",
        )
    """
).replace("__SAMPLES__", str(SAMPLES))


@pytest.fixture
def artifact(built_artifacts: Any) -> Path:
    _record, path = built_artifacts(Arch.parse(os.uname().machine))
    return Path(path)


def run_many(tmp_path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    task_file = tmp_path / "many.py"
    task_file.write_text(TASK)
    options = ["--model", "mockllm/model", "--max-samples", "1"]
    return eval_samples(tmp_path, inspect_eval(tmp_path, "many.py", *options, env=env))


def assert_every_sample_worked(samples: list[dict[str, Any]]) -> None:
    assert len(samples) == SAMPLES
    for sample in samples:
        assert sample.get("error") is None, (sample["id"], sample["error"])
        score = sample["scores"]["all_worked"]
        assert score["value"] == "C", (sample["id"], score["explanation"])


@pytest.fixture
def inspects_own_install() -> Iterator[None]:
    shutil.rmtree(INSPECT_TOOLS_DIR, ignore_errors=True)
    yield
    cli = INSPECT_TOOLS_DIR / "inspect-sandbox-tools"
    subprocess.run([str(cli), "stop-server"], capture_output=True, timeout=60, check=False)
    shutil.rmtree(INSPECT_TOOLS_DIR, ignore_errors=True)


def leftover_server(install_dir: Path, artifact: Path) -> int:
    """A server of an earlier install at `install_dir`, still alive once that install is
    removed (a host that reuses its install directory across runs): its pid."""
    install_dir.mkdir(mode=0o700)
    cli = install_dir / "inspect-sandbox-tools"
    shutil.copy(artifact, cli)
    cli.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_TOOLS_DIR"}
    subprocess.run([str(cli), "start-server"], check=True, capture_output=True, env=env)
    (pid_file,) = install_dir.glob(".run-*/server.pid")
    pid = int(pid_file.read_text())
    shutil.rmtree(install_dir)
    return pid


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_inspects_own_host_code_on_our_runtime(
    artifact: Path, inspects_own_install: None, tmp_path: Path
) -> None:
    """User path: inspect's own tools with our artifact as inspect's runtime, `local`,
    20 samples in a row, with a server of an earlier install at the same path still
    alive. Before, it and the new install's server took one socket from each other: 5
    runs in 6 failed, and servers whose directory was gone never exited."""
    from sandbox_tools.inspect.dropin import as_inspect_dev_runtime

    leftover = leftover_server(INSPECT_TOOLS_DIR, artifact)
    try:
        with as_inspect_dev_runtime(artifact, Arch.parse(os.uname().machine)):
            samples = run_many(
                tmp_path,
                {"JOURNEY_TOOLS": "inspect", "INSPECT_SANDBOX_TOOLS_INSTALL_STATE": "edited"},
            )
        assert_every_sample_worked(samples)
        assert gone(leftover), "the earlier install's server is still running"
        (log,) = INSPECT_TOOLS_DIR.glob(".run-*/server.log")
        assert "listening again" not in log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)


def test_our_tools(artifact: Path, tmp_path: Path) -> None:
    """User path: our tools (README's inspect example) on the `local` sandbox, 20 samples
    in a row, with a server of an earlier install at the same path still alive (its
    install removed underneath it, then made again by the first sample)."""
    leftover, install_dir = asyncio.run(our_leftover_server(artifact))
    try:
        samples = run_many(
            tmp_path, {"JOURNEY_TOOLS": "ours", "SANDBOX_TOOLS_DIST": str(artifact.parent)}
        )
        assert_every_sample_worked(samples)
        assert gone(leftover), "the earlier install's server is still running"
        log = Path(install_dir, "run", "server.log")
        assert "listening again" not in log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)


async def our_leftover_server(artifact: Path) -> tuple[int, str]:
    """Our injector's install on this machine, its server started, then the install
    removed with the server alive: (the server's pid, the install directory)."""
    from sandbox_tools.injector.acquire import Dist
    from sandbox_tools.injector.inject import Injector
    from sandbox_tools.injector.options import InjectionOptions
    from sandbox_tools.sandboxes.local import LocalSandbox

    async with Injector(InjectionOptions(sources=[Dist(artifact.parent)])) as injector:
        support = await injector.tool_support(LocalSandbox())
        info = await support.client.call("runtime_info")
        install_dir = support.install_dir
    shutil.rmtree(install_dir)
    return int(info["pid"]), install_dir


LEAVING_TASK = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, TaskState, solver
    from sandbox_tools.inspect import bash_session, exec_remote


    @solver
    def leave_things_open():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            await bash_session()(action="type_submit", input="echo open")
            process = await exec_remote(["sleep", "4321"])  # never waited for
            state.store.set("pid", process.pid)
            return state

        return solve


    @task
    def leaving():
        return Task(
            dataset=[Sample(input=str(n)) for n in range(3)],
            solver=leave_things_open(),
            sandbox="local",
        )
    """
)


def processes_running(cmdline: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == cmdline:
                found.append(int(entry.name))
    return found


def children_of(pid: int, since: float) -> list[str]:
    """The live children of `pid` started after `since` (wall clock): other tests on this
    machine may share the server and leave theirs."""
    boot = next(
        float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime")
    )  # fmt: skip
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        started = boot + int(fields[19]) / ticks
        if entry.name.isdigit() and int(fields[1]) == pid and started >= since - 1:
            found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


def test_what_a_sample_opened_is_released_at_its_end(artifact: Path, tmp_path: Path) -> None:
    """User path: our tools on a sandbox that outlives its samples. Each sample leaves a
    bash session and a running process; at its end our tools close and kill them, so
    the one runtime server holds nothing from earlier samples."""
    (tmp_path / "leaving.py").write_text(LEAVING_TASK)
    for pid in processes_running(b"sleep\x004321\x00"):  # an earlier run's, if any
        os.kill(pid, signal.SIGKILL)
    began = time.time()
    options = ["--model", "mockllm/model", "--max-samples", "1"]
    done = inspect_eval(
        tmp_path, "leaving.py", *options, env={"SANDBOX_TOOLS_DIST": str(artifact.parent)}
    )
    samples = eval_samples(tmp_path, done)
    assert [s.get("error") for s in samples] == [None, None, None]
    event = next(e["data"] for e in samples[0]["events"] if e.get("source") == "sandbox-tools")
    from sandbox_tools.injector.inject import runtime_env
    from sandbox_tools.injector.jsonrpc_client import ExecRuntimeClient
    from sandbox_tools.sandboxes.local import LocalSandbox

    exe = f"{event['install_dir']}/sandbox-tools"
    client = ExecRuntimeClient(LocalSandbox(), [exe], env=runtime_env(event["install_dir"]))
    server = asyncio.run(client.call("runtime_info"))["pid"]
    assert children_of(server, began) == []  # no shell, no sleep: all were released
    for sample in samples:
        assert not Path(f"/proc/{sample['store']['pid']}").exists()
