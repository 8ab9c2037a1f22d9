"""Our tools in an ordinary inspect task: a real `inspect eval` (mockllm plays the model)
where the model calls `sandbox_tools.inspect.bash_session()` and `text_editor()` and a
solver uses our `exec_remote`, in Docker sandboxes where inspect's own tools cannot run:
an image with no libc at all, and a read-only root with an exec tmpfs. The scorer checks
the answers the tools produced, in the sandbox itself."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import run_inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
pytestmark = pytest.mark.docker

TASK = textwrap.dedent(
    """
    import json

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
    from inspect_ai.util import ExecCompleted, ExecStdout, sandbox

    from sandbox_tools.inspect import bash_session, exec_remote, text_editor

    ANSWER = "/tmp/answer.txt"
    M = "mockllm/model"
    SCRIPT = [
        ModelOutput.for_tool_call(
            M, "bash_session", {"action": "type_submit", "input": "cd /tmp && X=$((6*7))"}
        ),
        ModelOutput.for_tool_call(
            M, "bash_session", {"action": "type_submit", "input": "echo $X > answer.txt; pwd"}
        ),
        ModelOutput.for_tool_call(
            M, "text_editor", {"command": "str_replace", "path": ANSWER, "old_str": "42",
                               "new_str": "forty-two"}
        ),
        ModelOutput.for_tool_call(M, "text_editor", {"command": "view", "path": ANSWER}),
        ModelOutput.from_content(M, "The answer is in /tmp/answer.txt"),
    ]
    for output in SCRIPT:  # given usage: mockllm would otherwise fetch a tokenizer online
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


    @solver
    def remote_first():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            seen = []
            proc = await exec_remote(["sh", "-c", "echo streamed; exit 7"])
            async for event in proc:
                if isinstance(event, ExecStdout):
                    seen.append(event.data)
                elif isinstance(event, ExecCompleted):
                    seen.append(event.exit_code)
            done = await exec_remote(["sh", "-c", "echo awaited"], stream=False)
            state.store.set("exec_remote", [seen, done.returncode, done.stdout])
            return state

        return solve


    @scorer(metrics=[accuracy()])
    def answer_in_sandbox():
        async def score(state: TaskState, target: Target) -> Score:
            written = await sandbox().exec(["cat", ANSWER])
            tools = [m.content for m in state.messages if m.role == "tool"]
            ok = (
                written.stdout == "forty-two\\n"
                and state.store.get("exec_remote") == [["streamed\\n", 7], 0, "awaited\\n"]
                and "/tmp" in tools[1]
                and "forty-two" in tools[3]
            )
            detail = {"file": written.stdout, "tools": tools,
                      "exec_remote": state.store.get("exec_remote")}
            return Score(value=CORRECT if ok else INCORRECT, explanation=json.dumps(detail))

        return score


    @task
    def our_tools():
        return Task(
            dataset=[Sample(input="Compute 6*7 and leave the answer in /tmp/answer.txt")],
            solver=[remote_first(), use_tools(bash_session(), text_editor()), generate()],
            scorer=answer_in_sandbox(),
            model=get_model(M, custom_outputs=SCRIPT),
        )
    """
)


def _eval(tmp_path: Path, artifact_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    task_file = tmp_path / "our_tools_task.py"
    task_file.write_text(TASK)
    sandbox_config = tmp_path / "sandbox.json"
    sandbox_config.write_text(json.dumps(config))
    env = {"SANDBOX_TOOLS_DIST": str(artifact_dir)}
    sample, _log = run_inspect_eval(task_file, "--sandbox", f"docker_sdk:{sandbox_config}", env=env)
    score = next(iter(sample["scores"].values()))
    assert score["value"] == "C", score["explanation"]
    return sample


def test_our_tools_in_an_eval_on_an_image_without_libc(
    docker_engine: Any, built_artifacts: Any, tmp_path: Path
) -> None:
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    arch = Arch.parse(os.uname().machine)
    _record, artifact = built_artifacts(arch)
    image = ensure_busybox_image(docker_engine, arch)
    _eval(tmp_path, artifact.parent, {"image": image})


def test_our_tools_in_an_eval_on_a_read_only_root(
    python_image: str, built_artifacts: Any, tmp_path: Path
) -> None:
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    config = {"image": python_image, "read_only": True, "tmpfs": {"/tmp": "exec,mode=1777"}}
    _eval(tmp_path, artifact.parent, config)
