"""User journeys: an evaluation author's inspect task, written as README.md and
docs/INSPECT.md write it ("A task with our tools"), run with a real `inspect eval` and
mockllm, for each way the docs configure the sandbox and each kind of sandbox user.

Each journey asserts what the author sees: the exit code, the sample's score, the
transcript's sandbox-tools event, the error text. Run them alone with `-m journey`.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import eval_samples, inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
pytestmark = [pytest.mark.journey, pytest.mark.docker]

# The docs' task, made whole: the model (mockllm, given usage so that it needs no
# tokenizer from the network) runs a shell command and edits a file; the scorer reads
# the file in the sandbox.
TASK = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState, generate, use_tools
    from inspect_ai.util import sandbox
    from sandbox_tools.inspect import DockerSdkConfig, bash_session, exec_remote, text_editor

    M = "mockllm/model"
    SCRIPT = [
        ModelOutput.for_tool_call(
            M,
            "bash_session",
            {{"action": "type_submit", "input": "id -u > {workdir}/who; echo done"}},
        ),
        ModelOutput.for_tool_call(
            M,
            "text_editor",
            {{"command": "create", "path": "{workdir}/answer.txt", "file_text": "42\\n"}},
        ),
        ModelOutput.from_content(M, "done"),
    ]
    for output in SCRIPT:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


    @scorer(metrics=[accuracy()])
    def written():
        async def score(state: TaskState, target: Target) -> Score:
            answer = await sandbox().exec(["cat", "{workdir}/answer.txt", "{workdir}/who"])
            awaited = await exec_remote(["sh", "-c", "id -u"], stream=False)
            seen = [answer.stdout, awaited.stdout]
            uid = target.text + "\\n"
            ok = answer.stdout == "42\\n" + uid and awaited.stdout == uid
            return Score(value=CORRECT if ok else INCORRECT, explanation=repr(seen))

        return score


    @task
    def my_task():
        return Task(
            dataset=[Sample(input="Write 42 to the answer file", target="{uid}")],
            solver=[use_tools(bash_session(), text_editor()), generate()],
            scorer=written(),
            model=get_model(M, custom_outputs=SCRIPT),
            sandbox={sandbox},
        )
    """
)


def run_eval(
    directory: Path, sandbox: str, uid: int, workdir: str, env: dict[str, str], *options: str
) -> subprocess.CompletedProcess[str]:
    """`inspect eval my_task.py` from the task's directory, as the docs run it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "my_task.py").write_text(TASK.format(sandbox=sandbox, uid=uid, workdir=workdir))
    return inspect_eval(directory, "my_task.py", *options, env=env)


def the_sample(directory: Path, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    (sample,) = eval_samples(directory, done)
    assert sample.get("error") is None, sample["error"]
    return dict(sample)


def injection_event(sample: dict[str, Any]) -> dict[str, Any]:
    """What the transcript says about how the runtime got into the sandbox."""
    (event,) = [
        e
        for e in sample["events"]
        if e.get("event") == "info" and e.get("source") == "sandbox-tools"
    ]
    return dict(event["data"])


@pytest.fixture
def dist(built_artifacts: Any) -> dict[str, str]:
    """Where the journeys' artifact comes from: a local build (SANDBOX_TOOLS_DIST)."""
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    return {"SANDBOX_TOOLS_DIST": str(artifact.parent)}


USERS = {
    "root": (None, 0),
    "a-user-with-a-passwd-entry": ("nobody", 65534),
    "a-uid-without-a-passwd-entry": ("1000:1000", 1000),
}


@pytest.mark.parametrize("user", list(USERS))
def test_the_readme_config_object_for_any_default_user(
    python_image: str, dist: dict[str, str], tmp_path: Path, user: str
) -> None:
    """User path: `sandbox=("docker_sdk", DockerSdkConfig(image=...))` as in the docs,
    with the sandbox's default user set as evaluation authors do (`user="1000:1000"`)."""
    name, uid = USERS[user]
    config = f"DockerSdkConfig(image={python_image!r}, user={name!r})"
    done = run_eval(tmp_path, f'("docker_sdk", {config})', uid, "/tmp", dist)
    sample = the_sample(tmp_path, done)
    assert sample["scores"]["written"]["value"] == "C", sample["scores"]["written"]
    event = injection_event(sample)
    # The runtime was installed and runs as root, out of the agent's reach.
    assert event["runs_as_uid"] == 0 and event["source"] == "dist" and not event["reused"]
    assert event["install_dir"].startswith("/") and event["seconds"] > 0


def test_a_read_only_root_with_a_tmpfs_as_uid_1000(
    python_image: str, dist: dict[str, str], tmp_path: Path
) -> None:
    """User path: read-only root, a tmpfs to work in, agent as uid 1000 (the error used
    to tell the author to "omit user=", which they never passed)."""
    config = (
        f"DockerSdkConfig(image={python_image!r}, user='1000:1000', read_only=True, "
        "tmpfs={'/tmp': 'exec,mode=1777'})"
    )
    done = run_eval(tmp_path, f'("docker_sdk", {config})', 1000, "/tmp", dist)
    sample = the_sample(tmp_path, done)
    assert sample["scores"]["written"]["value"] == "C", sample["scores"]["written"]


def test_busybox_without_libc_as_uid_1000(
    docker_engine: Any, dist: dict[str, str], tmp_path: Path
) -> None:
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    image = ensure_busybox_image(docker_engine, Arch.parse(os.uname().machine))
    config = f"DockerSdkConfig(image={image!r}, user='1000:1000')"
    done = run_eval(tmp_path, f'("docker_sdk", {config})', 1000, "/tmp", dist)
    sample = the_sample(tmp_path, done)
    assert sample["scores"]["written"]["value"] == "C", sample["scores"]["written"]
    # No bash in this image: the shell is `sh -i`, and the model is told so.
    first_output = next(m["content"] for m in sample["messages"] if m["role"] == "tool")
    assert "bash is not installed here; this session runs" in str(first_output)


def test_an_image_name_in_the_task_and_on_the_command_line(
    python_image: str, dist: dict[str, str], tmp_path: Path
) -> None:
    """User path: the docs' image-name form (docs/INSPECT.md, docker_sdk); inspect hands
    it over as a path under the task's directory."""
    done = run_eval(tmp_path / "task", f'("docker_sdk", {python_image!r})', 0, "/tmp", dist)
    the_sample(tmp_path / "task", done)
    done = run_eval(
        tmp_path / "cli", "None", 0, "/tmp", dist, "--sandbox", f"docker_sdk:{python_image}"
    )
    the_sample(tmp_path / "cli", done)


def test_a_config_file_on_the_command_line(
    python_image: str, dist: dict[str, str], tmp_path: Path
) -> None:
    """User path: `--sandbox docker_sdk:sandbox.json` (docs/INSPECT.md, docker_sdk)."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "sandbox.json").write_text(json.dumps({"image": python_image, "user": "1000"}))
    done = run_eval(tmp_path, "None", 1000, "/tmp", dist, "--sandbox", "docker_sdk:sandbox.json")
    the_sample(tmp_path, done)


FAILING_TASK = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import sandbox
    from sandbox_tools.inspect import DockerSdkConfig, text_editor


    @solver
    def try_twice():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            errors = []
            for _ in range(2):
                try:
                    await text_editor()(command="view", path="/")
                except Exception as exc:
                    errors.append(str(exc))
            left = await sandbox().exec(["sh", "-c", "ls -A /tmp"])
            state.store.set("seen", dict(errors=errors, left=left.stdout))
            return state

        return solve


    @task
    def my_task():
        return Task(
            dataset=[Sample(input="x")],
            solver=try_twice(),
            sandbox=("docker_sdk", DockerSdkConfig(
                image={image!r}, user="1000:1000", read_only=True,
                tmpfs=dict([("/tmp", "exec,mode=1777,size=1m"), ("/var/tmp", "noexec,mode=1777")]),
            )),
        )
    """
)


def test_a_failed_injection_is_tried_once_per_sandbox_and_leaves_nothing(
    python_image: str, dist: dict[str, str], tmp_path: Path
) -> None:
    """User path: an install that cannot finish (the tmpfs is smaller than the runtime).
    Every tool call says the same, but only the first tries: one upload, not one per
    call, and nothing left behind (five calls used to leave five 9 MB copies)."""
    (tmp_path / "my_task.py").write_text(FAILING_TASK.replace("{image!r}", repr(python_image)))
    done = inspect_eval(tmp_path, "my_task.py", "--model", "mockllm/model", env=dist)
    sample = the_sample(tmp_path, done)
    seen = sample["store"]["seen"]
    first, second = seen["errors"]
    assert first == second and "sandbox-tools could not start in inspect sandbox" in first
    assert "docker_sdk" in first.lower() or "DockerSdk" in first
    assert "sandbox-tools" not in seen["left"], seen["left"]
    commands = [str(e.get("cmd", "")) for e in sample["events"] if e.get("event") == "sandbox"]
    probes = [c for c in commands if "made=" in c and " probe " in c]  # it makes the directory
    assert len(probes) == 1, probes
    written = {c.split(".sandbox-tools.partial")[0][-40:] for c in commands if ".partial" in c}
    assert len(written) == 1, written  # one install directory written to, then removed


def test_the_eval_log_of_a_config_object_reads_back(
    python_image: str, dist: dict[str, str], tmp_path: Path
) -> None:
    """User path: `inspect eval my_task.py` with the default log format, as the docs run
    it. inspect reads the sandbox config back from the log it wrote; without that, every
    eval with a DockerSdkConfig ended with an unrelated ERROR and an unreadable log."""
    from inspect_ai.log import read_eval_log

    config = f"DockerSdkConfig(image={python_image!r}, user='1000:1000')"
    directory = tmp_path / "default-format"
    directory.mkdir()
    (directory / "my_task.py").write_text(
        TASK.format(sandbox=f'("docker_sdk", {config})', uid=1000, workdir="/tmp")
    )
    done = inspect_eval(directory, "my_task.py", env=dist, json_log=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "ERROR" not in output, output[-3000:]
    (log_file,) = (directory / "logs").glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "success" and log.samples is not None
    assert log.samples[0].scores is not None
    assert log.samples[0].scores["written"].value == "C"


def test_a_task_that_cannot_start_says_so_in_one_message(
    docker_engine: Any, dist: dict[str, str], tmp_path: Path
) -> None:
    """User path: a missing image. The eval stops before any sample with the message
    and its remedy, not at the end of a traceback of inspect's task groups."""
    done = run_eval(tmp_path, '("docker_sdk", "no-such-image:1")', 0, "/tmp", dist)
    output = " ".join((done.stdout + done.stderr).split())  # the console wraps lines
    assert done.returncode != 0
    assert "Pull or build the image first" in output and "Traceback" not in output, output
