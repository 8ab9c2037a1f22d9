"""inspect_ai's own tests of its sandbox tools, ported to ours with the least change.

Ported from inspect_ai's repository:
- tests/tools/sandbox_tools_utils/test_sandbox_tools.py (all seven: text_editor reads,
  a missing file, bash_session as root, as `nobody`, as a user that does not exist,
  text_editor as another user, text_editor with a relative path);
- tests/tools/test_bash_session_output_limit.py (the cut follows the sandbox's exec
  output limit; inspect's version replaces its transport with fakes, this one runs it);
- tests/tools/test_sandbox_tool_eval.py::test_sandbox_environment_nonroot_files (a
  sample's file is the non-root user's to read; the `read_file`/`command_exec` tools are
  the small ones of inspect's test helpers, written again here);
- tests/util/sandbox/test_exec_remote.py, its fourteen tests against a real sandbox.

What changed, and only that: our tools are imported instead of inspect's
(`sandbox_tools.inspect`); inspect's `docker` sandbox with its compose files becomes our
`docker_sdk` sandbox with the same settings (`root`: the image as it is; `nonroot`: the
user `nonroot` with its home as working directory, as inspect's test_sandbox_compose.yaml);
inspect's Alpine compose file has no image here (no registry), so its rows are not run;
each mockllm output carries a usage (mockllm would otherwise fetch a tokenizer online).
The exec_remote tests call inspect's internal `exec_remote_streaming`/`_awaitable` on a
sandbox; ours is called as a task calls it, so they run as one solver of one eval, each
check reported on its own. Two look at inspect's private state (`proc._killed`, and
`_last_seq`/`_poll` for a lost answer): the kill is checked through what a caller sees,
the lost answer is covered by our own tests of acknowledged output (see
docs/INSPECT_COMPAT.md). docs/INSPECT_COMPAT.md lists every test and its result.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import NONROOT, get_tool_call, get_tool_response

inspect_ai = pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from inspect_ai import Task, eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.model import (  # noqa: E402
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import includes, match  # noqa: E402
from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools  # noqa: E402
from inspect_ai.tool import ToolCallError, tool  # noqa: E402
from inspect_ai.util import sandbox  # noqa: E402

from sandbox_tools.inspect import bash_session, text_editor  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]
M = "mockllm/model"


# -- what inspect's test helpers give its tests, written for ours -------------------------


def outputs(*script: ModelOutput) -> list[ModelOutput]:
    for output in script:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return list(script)


@tool
def command_exec() -> Any:
    async def execute(command: str) -> str:
        """Run a bash script in the sandbox's working directory.

        Args:
            command: The script.

        Returns:
            What it printed and how it exited.
        """
        return str(await sandbox().exec(cmd=["bash", "-c", command], timeout=90))

    return execute


@tool
def read_file() -> Any:
    async def execute(file: str) -> str:
        """Read a file.

        Args:
            file: The file.

        Returns:
            Its contents.
        """
        return await sandbox().read_file(file)

    return execute


# -- the sandboxes: our docker_sdk in the settings of inspect's compose files ------------


@pytest.fixture
def sandboxes(
    self_check_image: str, built_artifacts: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    from sandbox_tools.inspect.docker_env import DockerSdkConfig

    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(artifact.parent))
    return {
        "root": ("docker_sdk", DockerSdkConfig(image=self_check_image)),
        "nonroot": (
            "docker_sdk",
            DockerSdkConfig(image=self_check_image, user=NONROOT, working_dir=f"/home/{NONROOT}"),
        ),
    }


def run(task: Task, model: Any, tmp_path: Path, **options: Any) -> Any:
    (log,) = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", **options)
    return log


# -- tests/tools/sandbox_tools_utils/test_sandbox_tools.py --------------------------------


@pytest.mark.parametrize("config", ["root", "nonroot"])
def test_text_editor_read(config: str, sandboxes: dict[str, Any], tmp_path: Path) -> None:
    task = Task(
        dataset=[Sample(input="Please read the file '/etc/passwd'")],
        solver=[use_tools([text_editor()]), generate()],
        scorer=match(),
        sandbox=sandboxes[config],
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="text_editor",
                tool_arguments={"command": "view", "path": "/etc/passwd"},
            ),
            ModelOutput.from_content(model=M, content="All done."),
        ),
    )
    log = run(task, model, tmp_path)
    assert log.status == "success"
    assert log.samples
    messages = log.samples[0].messages
    tool_call = get_tool_call(messages, "text_editor")
    assert tool_call
    response = get_tool_response(messages, tool_call)
    assert response
    assert response.error is None, f"Tool call returns error: {response.error}"
    assert "root:x:0:0:root" in response.text, f"Unexpected output: {response.content}"


def test_text_editor_read_missing(sandboxes: dict[str, Any], tmp_path: Path) -> None:
    task = Task(
        dataset=[Sample(input="Please read the file '/missing.txt'")],
        solver=[use_tools([text_editor()]), generate()],
        scorer=match(),
        sandbox=sandboxes["root"],
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="text_editor",
                tool_arguments={"command": "view", "path": "/missing.txt"},
            ),
            ModelOutput.from_content(model=M, content="All done."),
        ),
    )
    log = run(task, model, tmp_path)
    assert log.status == "success"
    assert log.samples
    messages = log.samples[0].messages
    tool_call = get_tool_call(messages, "text_editor")
    assert tool_call
    response = get_tool_response(messages, tool_call)
    assert response
    assert response.error  # Expect ToolError as file is missing
    assert isinstance(response.error, ToolCallError)


def _whoami_task(tool_user: str | None, sandbox_spec: Any) -> tuple[Task, Any]:
    task = Task(
        dataset=[Sample(input='What is the output of running echo "start $(whoami) end"?')],
        solver=[use_tools([bash_session(user=tool_user)]), generate()],
        scorer=match(),
        sandbox=sandbox_spec,
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="bash_session",
                tool_arguments={"action": "type_submit", "input": 'echo "start $(whoami) end"'},
            ),
            ModelOutput.from_content(model=M, content="All done."),
        ),
    )
    return task, model


@pytest.mark.parametrize(("tool_user", "expected"), [(None, "root"), ("nobody", "nobody")])
def test_bash_session_root_and_non_root(
    tool_user: str | None, expected: str, sandboxes: dict[str, Any], tmp_path: Path
) -> None:
    """inspect's test_bash_session_root and test_bash_session_non_root."""
    log = run(*_whoami_task(tool_user, sandboxes["root"]), tmp_path)
    assert log.status == "success"
    assert log.samples
    messages = log.samples[0].messages
    response = get_tool_response(messages, get_tool_call(messages, "bash_session"))
    assert response.error is None, f"Tool call returns error: {response.error}"
    assert f"start {expected} end" in response.text, f"Unexpected output: {response.content}"


def test_bash_session_missing_user(sandboxes: dict[str, Any], tmp_path: Path) -> None:
    log = run(*_whoami_task("foo", sandboxes["root"]), tmp_path)
    # The eval fails: the task's author named a user that does not exist, the model
    # did nothing wrong.
    assert log.status == "error"


def test_text_editor_user(sandboxes: dict[str, Any], tmp_path: Path) -> None:
    flag = "this_is_it"
    task = Task(
        dataset=[Sample(input="Create /flag only readable by root, then read it")],
        solver=[
            use_tools([bash_session(user="root"), text_editor(user="nobody")]),
            generate(),
        ],
        scorer=match(),
        sandbox=sandboxes["root"],
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="bash_session",
                tool_arguments={
                    "action": "type_submit",
                    "input": f"echo {flag} > /flag && chmod 400 /flag; ls -al /flag && cat /flag",
                },
            ),
            ModelOutput.for_tool_call(
                model=M,
                tool_name="text_editor",
                tool_arguments={"command": "view", "path": "/flag"},
            ),
            ModelOutput.from_content(model=M, content="All done."),
        ),
    )
    log = run(task, model, tmp_path)
    assert log.status == "success"
    assert log.samples
    messages = log.samples[0].messages
    bash_response = get_tool_response(messages, get_tool_call(messages, "bash_session"))
    editor_response = get_tool_response(messages, get_tool_call(messages, "text_editor"))
    assert "-r--------" in bash_response.text  # Expect read only flag
    assert "root root" in bash_response.text  # Expect flag owned by root
    assert editor_response
    assert flag not in editor_response.text


@pytest.mark.parametrize(
    ("config", "path"),
    [("root", "tmp/test_relative.txt"), ("nonroot", "../../tmp/test_relative.txt")],
)
def test_text_editor_relative_path(
    config: str, path: str, sandboxes: dict[str, Any], tmp_path: Path
) -> None:
    """inspect's test (working directory `/`), and the same file from a home directory."""
    file_content = "here's the file contents"
    task = Task(
        dataset=[Sample(input="doesn't matter", files={"/tmp/test_relative.txt": file_content})],
        solver=[use_tools([text_editor()]), generate()],
        scorer=match(),
        sandbox=sandboxes[config],
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="text_editor",
                tool_arguments={"command": "view", "path": path},
            ),
            ModelOutput.from_content(model=M, content="All done."),
        ),
    )
    log = run(task, model, tmp_path)
    assert log.status == "success"
    assert log.samples
    messages = log.samples[0].messages
    editor_response = get_tool_response(messages, get_tool_call(messages, "text_editor"))
    assert file_content in editor_response.text


# -- tests/tools/test_bash_session_output_limit.py ----------------------------------------


@pytest.mark.parametrize("limit", [20 * 1024**2, 64 * 1024])
def test_bash_session_passes_effective_max_output_size(
    limit: int, sandboxes: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inspect's test checks that the sandbox's exec output limit reaches the runtime as
    the session's cut; run for real: 300,000 bytes come whole under a 20 MiB limit and
    are cut to 64 KiB under a 64 KiB one, where the sample goes on (no transport error)."""
    monkeypatch.setenv("INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE", str(limit))
    task = Task(
        dataset=[Sample(input="print a lot")],
        solver=[use_tools([bash_session(instance="output-limit-test")]), generate()],
        scorer=match(),
        sandbox=sandboxes["root"],
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="bash_session",
                tool_arguments={
                    "action": "type_submit",
                    "input": "head -c 300000 /dev/zero | tr '\\0' '\"'; echo; echo ok",
                },
            ),
            ModelOutput.from_content(model=M, content="All done."),
        ),
    )
    # inspect's own cut of what the model sees (16 KiB by default) is lifted to see ours
    log = run(task, model, tmp_path, max_tool_output=1_000_000)
    assert log.status == "success", log.error
    messages = log.samples[0].messages
    response = get_tool_response(messages, get_tool_call(messages, "bash_session"))
    assert response.error is None, response.error
    quotes = response.text.count('"')
    if limit > 300_000:
        assert quotes >= 300_000 and "ok" in response.text
    else:
        notice, _, kept = response.text.partition("\n")
        assert "earlier output truncated" in notice
        assert 0 < len(kept.encode()) <= limit and quotes < 300_000 and "ok" in kept


# -- tests/tools/test_sandbox_tool_eval.py ------------------------------------------------


def test_sandbox_environment_nonroot_files(sandboxes: dict[str, Any], tmp_path: Path) -> None:
    """Checks the file passed in as part of the Sample is readable by the sandbox's user."""
    task = Task(
        dataset=[Sample(input="What is in bar.txt?", files={"bar.txt": "hello"}, target="x")],
        solver=[use_tools([command_exec(), read_file()]), generate()],
        scorer=includes(),
        sandbox=sandboxes["nonroot"],
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M, tool_name="command_exec", tool_arguments={"command": "id"}
            ),
            ModelOutput.for_tool_call(
                model=M, tool_name="read_file", tool_arguments={"file": "bar.txt"}
            ),
            *[ModelOutput.from_content(model=M, content="finished") for _ in range(3)],
        ),
    )
    log = run(task, model, tmp_path, message_limit=5)
    assert log.status == "success"
    messages = log.samples[0].messages
    id_response = get_tool_response(messages, get_tool_call(messages, "command_exec"))
    # the test is broken if it's ended up as the root user
    assert "uid=0(root)" not in id_response.text
    read_response = get_tool_response(messages, get_tool_call(messages, "read_file"))
    assert not read_response.error
    assert "hello" in read_response.text


# -- tests/util/sandbox/test_exec_remote.py: its tests against a real sandbox -------------

EXEC_REMOTE_CHECKS = """
import asyncio

from inspect_ai.util import (
    ExecCompleted, ExecRemoteAwaitableOptions, ExecRemoteStreamingOptions, ExecStderr,
    ExecStdout,
)
from inspect_ai.util._sandbox.exec_remote import ExecRemoteCommonOptions
from sandbox_tools.inspect import exec_remote


async def exec_remote_streaming(cmd, opts=None):
    return await exec_remote(cmd, opts or ExecRemoteStreamingOptions(), stream=True)


async def exec_remote_awaitable(cmd, opts=None):
    if isinstance(opts, ExecRemoteCommonOptions) and not isinstance(
        opts, ExecRemoteAwaitableOptions
    ):
        opts = ExecRemoteAwaitableOptions(**opts.__dict__)
    return await exec_remote(cmd, opts or ExecRemoteAwaitableOptions(), stream=False)


async def test_streaming_echo():
    proc = await exec_remote_streaming(["echo", "hello"])
    events = [event async for event in proc]
    stdout_events = [e for e in events if isinstance(e, ExecStdout)]
    completed = [e for e in events if isinstance(e, ExecCompleted)]
    assert len(completed) == 1
    assert completed[0].exit_code == 0
    assert "hello" in "".join(e.data for e in stdout_events)


async def test_streaming_stderr():
    proc = await exec_remote_streaming(["sh", "-c", "echo err >&2"])
    events = [event async for event in proc]
    stderr_events = [e for e in events if isinstance(e, ExecStderr)]
    assert "err" in "".join(e.data for e in stderr_events)


async def test_streaming_nonzero_exit():
    proc = await exec_remote_streaming(["sh", "-c", "exit 42"])
    events = [event async for event in proc]
    completed = [e for e in events if isinstance(e, ExecCompleted)]
    assert len(completed) == 1
    assert completed[0].exit_code == 42


async def test_awaitable_echo():
    result = await exec_remote_awaitable(["echo", "hello"])
    assert result.success
    assert "hello" in result.stdout


async def test_awaitable_failure():
    result = await exec_remote_awaitable(["sh", "-c", "echo oops >&2; exit 1"])
    assert not result.success
    assert result.returncode == 1
    assert "oops" in result.stderr


async def test_streaming_multiline():
    proc = await exec_remote_streaming(["sh", "-c", "echo line1; echo line2; echo line3"])
    events = [event async for event in proc]
    stdout = "".join(e.data for e in events if isinstance(e, ExecStdout))
    assert "line1" in stdout
    assert "line2" in stdout
    assert "line3" in stdout


async def test_streaming_kill():
    # inspect's asserts its private `proc._killed`; what a caller sees of it instead:
    # the iteration ends, without an ExecCompleted, and the process is gone
    proc = await exec_remote_streaming(["sleep", "300"])
    await proc.kill()
    events = [event async for event in proc]
    assert not [e for e in events if isinstance(e, ExecCompleted)]


async def test_awaitable_timeout():
    try:
        await exec_remote_awaitable(
            ["sleep", "300"], ExecRemoteAwaitableOptions(timeout=2, poll_interval=0.5)
        )
    except TimeoutError:
        return
    raise AssertionError("no TimeoutError")


async def test_streaming_stdin():
    opts = ExecRemoteStreamingOptions(stdin_open=True)
    proc = await exec_remote_streaming(["cat"], opts)
    await proc.write_stdin("hello from stdin\\n")
    await proc.close_stdin()
    events = [event async for event in proc]
    stdout = "".join(e.data for e in events if isinstance(e, ExecStdout))
    assert "hello from stdin" in stdout
    completed = [e for e in events if isinstance(e, ExecCompleted)]
    assert len(completed) == 1
    assert completed[0].exit_code == 0


async def test_env_vars():
    opts = ExecRemoteCommonOptions(env={"MY_TEST_VAR": "hello123"})
    result = await exec_remote_awaitable(["sh", "-c", "echo $MY_TEST_VAR"], opts)
    assert result.success
    assert "hello123" in result.stdout


async def test_cwd():
    opts = ExecRemoteCommonOptions(cwd="/tmp")
    result = await exec_remote_awaitable(["pwd"], opts)
    assert result.success
    assert "/tmp" in result.stdout


async def test_input_string():
    opts = ExecRemoteCommonOptions(input="hello from input\\n")
    result = await exec_remote_awaitable(["cat"], opts)
    assert result.success
    assert "hello from input" in result.stdout


async def test_input_bytes():
    opts = ExecRemoteCommonOptions(input=b"bytes input\\n")
    result = await exec_remote_awaitable(["cat"], opts)
    assert result.success
    assert "bytes input" in result.stdout


# inspect's "error guards", the ones that hold for any ExecRemoteProcess a caller has:
async def test_write_stdin_without_stdin_open_raises():
    proc = await exec_remote_streaming(["cat"])
    try:
        await proc.write_stdin("data")
    except RuntimeError as error:
        assert "stdin_open=True in ExecRemoteStreamingOptions" in str(error)
    else:
        raise AssertionError("no RuntimeError")
    finally:
        await proc.kill()


async def test_close_stdin_without_stdin_open_raises():
    proc = await exec_remote_streaming(["cat"])
    try:
        await proc.close_stdin()
    except RuntimeError as error:
        assert "stdin_open=True in ExecRemoteStreamingOptions" in str(error)
    else:
        raise AssertionError("no RuntimeError")
    finally:
        await proc.kill()


async def test_write_stdin_after_completed_raises():
    proc = await exec_remote_streaming(["true"], ExecRemoteStreamingOptions(stdin_open=True))
    await proc.close_stdin()
    _ = [event async for event in proc]
    try:
        await proc.write_stdin("data")
    except RuntimeError as error:
        assert "process has terminated" in str(error)
    else:
        raise AssertionError("no RuntimeError")


async def test_write_stdin_after_killed_raises():
    proc = await exec_remote_streaming(["cat"], ExecRemoteStreamingOptions(stdin_open=True))
    await proc.kill()
    try:
        await proc.write_stdin("data")
    except RuntimeError as error:
        assert "process has terminated" in str(error)
    else:
        raise AssertionError("no RuntimeError")


async def test_close_stdin_after_completed_or_killed_is_noop():
    proc = await exec_remote_streaming(["cat"], ExecRemoteStreamingOptions(stdin_open=True))
    await proc.kill()
    await proc.close_stdin()


async def test_second_iteration_raises():
    proc = await exec_remote_streaming(["true"])
    _ = [event async for event in proc]
    try:
        aiter(proc)
    except RuntimeError as error:
        assert "can only be iterated once" in str(error)
    else:
        raise AssertionError("no RuntimeError")


CHECKS = {name: f for name, f in dict(globals()).items() if name.startswith("test_")}
"""


@solver
def exec_remote_checks() -> Any:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        import traceback

        space: dict[str, Any] = {}
        exec(EXEC_REMOTE_CHECKS, space)
        results = {}
        for name, check in space["CHECKS"].items():
            try:
                await check()
                results[name] = "passed"
            except BaseException:
                results[name] = traceback.format_exc()[-2000:]
        state.store.set("exec_remote_checks", json.dumps(results))
        return state

    return solve


@pytest.fixture(scope="module")
def exec_remote_results(
    self_check_image: str, built_artifacts: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    from sandbox_tools.inspect.docker_env import DockerSdkConfig

    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SANDBOX_TOOLS_DIST", str(artifact.parent))
        task = Task(
            dataset=[Sample(input="run the checks")],
            solver=[exec_remote_checks()],
            sandbox=("docker_sdk", DockerSdkConfig(image=self_check_image)),
        )
        log = run(task, get_model(M, custom_outputs=outputs()), tmp_path_factory.mktemp("er"))
    assert log.status == "success", log.error
    yield json.loads(log.samples[0].store["exec_remote_checks"])


EXEC_REMOTE_NAMES = [
    line.split("(")[0].removeprefix("async def ")
    for line in EXEC_REMOTE_CHECKS.splitlines()
    if line.startswith("async def test_")
]


@pytest.mark.parametrize("check", EXEC_REMOTE_NAMES)
def test_exec_remote(check: str, exec_remote_results: dict[str, str]) -> None:
    assert exec_remote_results[check] == "passed", exec_remote_results[check]


def test_a_task_with_the_browser_and_no_add_on_fails_before_any_sample(
    sandboxes: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime is checked at the task's start; the browser add-on was found missing
    only at a sample's first browser call, after its other work. Now both are checked
    before any sample, when a task of the evaluation uses `web_browser()`. (As an
    installed package: a source checkout would build the add-on there and then.)"""
    from sandbox_tools.injector import acquire
    from sandbox_tools.inspect import web_browser

    monkeypatch.setattr(acquire, "checkout_root", lambda: None)
    monkeypatch.setenv("SANDBOX_TOOLS_CACHE", str(tmp_path / "empty-cache"))

    task = Task(
        dataset=[Sample(input="browse")],
        solver=[use_tools([bash_session(), *web_browser()]), generate()],
        sandbox=sandboxes["root"],  # a dist with the runtime alone
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M, tool_name="bash_session", tool_arguments={"action": "read"}
            ),
            ModelOutput.from_content(model=M, content="done"),
        ),
    )
    from inspect_ai._util.error import PrerequisiteError

    with pytest.raises(PrerequisiteError, match="no browser add-on for") as failed:
        run(task, model, tmp_path)
    assert "--with-browser" in str(failed.value)  # what to do


@solver
def remote_pwd() -> Any:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        from sandbox_tools.inspect import exec_remote

        done = await exec_remote(["pwd"], stream=False)
        state.store.set("exec_remote_pwd", done.stdout)
        state.store.set("exec_pwd", (await sandbox().exec(["pwd"])).stdout)
        return state

    return solve


def test_a_non_root_users_tools_start_in_the_working_directory(
    self_check_image: str, built_artifacts: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a non-root default user, the shell and exec_remote started in the user's home
    (or /), while `sandbox().exec` ran in the working directory, as inspect's do."""
    from sandbox_tools.inspect.docker_env import DockerSdkConfig

    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(artifact.parent))
    config = DockerSdkConfig(image=self_check_image, user=NONROOT, working_dir="/tmp")
    task = Task(
        dataset=[Sample(input="where am I")],
        solver=[remote_pwd(), use_tools([bash_session()]), generate()],
        sandbox=("docker_sdk", config),
    )
    model = get_model(
        M,
        custom_outputs=outputs(
            ModelOutput.for_tool_call(
                model=M,
                tool_name="bash_session",
                tool_arguments={"action": "type_submit", "input": "pwd; echo $HOME"},
            ),
            ModelOutput.from_content(model=M, content="done"),
        ),
    )
    log = run(task, model, tmp_path)
    assert log.status == "success", log.error
    sample = log.samples[0]
    assert sample.store["exec_pwd"] == "/tmp\n"
    assert sample.store["exec_remote_pwd"] == "/tmp\n"
    response = get_tool_response(sample.messages, get_tool_call(sample.messages, "bash_session"))
    assert f"/tmp\n/home/{NONROOT}" in response.text, response.text
