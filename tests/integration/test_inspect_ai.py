"""inspect_ai: our `modal` sandbox is found through its registry, and a real `inspect eval`
injects the built runtime through the adapter and uses all three tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import run_inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
# This machine is the sandbox: its install directory and server are shared with others.
pytestmark = pytest.mark.usefixtures("this_host_as_sandbox")

TASK = textwrap.dedent(
    """
    import json

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import sandbox

    from sandbox_tools.injector import exec_remote
    from sandbox_tools.injector.inject import tool_support_sandbox
    from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
    from sandbox_tools.inspect.adapter import InspectSandbox

    NOTES = "__NOTES__"


    @solver
    def use_sandbox_tools():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            support = await tool_support_sandbox(InspectSandbox(sandbox()))
            try:
                ran = await exec_remote(support.client, "echo remote-$((6*7))", stream=False)
                session = await new_bash_session(support.client)
                shell = await bash_session(support.client, session, "echo bash-$((2+3))\\n")
                await text_editor(support.client, "create", NOTES, file_text="alpha\\nbeta\\n")
                await text_editor(
                    support.client, "str_replace", NOTES, old_str="beta", new_str="gamma"
                )
                view = await text_editor(support.client, "view", NOTES)
            finally:
                await support.aclose()
            state.store.set(
                "results",
                {
                    "exec_remote": ran.stdout,
                    "exit_code": ran.returncode,
                    "bash": shell,
                    "view": view,
                    "artifact": support.artifact.name,
                    "installed_at": support.install_dir,
                },
            )
            return state

        return solve


    @scorer(metrics=[accuracy()])
    def every_tool_answered():
        async def score(state: TaskState, target: Target) -> Score:
            r = state.store.get("results")
            ok = (
                r["exec_remote"] == "remote-42\\n"
                and r["exit_code"] == 0
                and "bash-5" in r["bash"]
                and "gamma" in r["view"]
                and "beta" not in r["view"]
            )
            return Score(value=CORRECT if ok else INCORRECT, explanation=json.dumps(r))

        return score


    @task
    def sandbox_tools_in_inspect():
        return Task(
            dataset=[Sample(input="use the tools")],
            solver=use_sandbox_tools(),
            scorer=every_tool_answered(),
            sandbox="local",
        )
    """
)


def test_modal_is_found_through_inspect_ais_registry() -> None:
    """A fresh interpreter, no import of ours: inspect_ai finds it via the entry point."""
    probe = (
        "from inspect_ai.util._sandbox.registry import registry_find_sandboxenv\n"
        "from inspect_ai._util.registry import registry_info\n"
        "found = registry_find_sandboxenv('modal')\n"
        "print(found.__module__, registry_info(found).name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["sandbox_tools.inspect.modal_env", "sandbox_tools/modal"]


def test_inspect_eval_injects_our_runtime_and_uses_every_tool(
    built_artifacts: Any, tmp_path: Path
) -> None:
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    task_file = tmp_path / "sandbox_tools_task.py"
    task_file.write_text(TASK.replace("__NOTES__", str(tmp_path / "notes.txt")))
    env = {"SANDBOX_TOOLS_DIST": str(artifact.parent)}  # the artifact built for this session
    sample, _log = run_inspect_eval(task_file, "--model", "mockllm/model", env=env, timeout=600)
    score = next(iter(sample["scores"].values()))
    details = json.loads(score["explanation"])
    assert score["value"] == "C", details
    assert details["artifact"] == artifact.name
    assert (tmp_path / "notes.txt").read_text() == "alpha\ngamma\n"
