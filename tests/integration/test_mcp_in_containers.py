"""The MCP bridge in real containers, with our built artifact injected: a FastMCP server
(the `mcp` package installed offline from the host) over the persistent channel and over
one exec per call; a libc-free image where the command does not exist; and a real
`inspect eval` where the model calls the server's tools through our
`sandbox_tools.inspect.mcp_server_sandbox()` and through inspect's own, on our runtime."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from mcp import ClientSession, StdioServerParameters
from mcp.shared.exceptions import McpError
from mcp.types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    LoggingMessageNotificationParams,
    TextContent,
)

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.mcp_client import sandbox_mcp_client
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import RunningContainer
from tests.support import (
    MCP_SERVERS_MOUNT,
    MCP_SITE_MOUNT,
    arches_under_test,
    ensure_target_image,
    run_inspect_eval,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

DEMO = StdioServerParameters(
    command="python3",
    args=[f"{MCP_SERVERS_MOUNT}/demo_server.py"],
    env={"PYTHONPATH": MCP_SITE_MOUNT},
)


@pytest.fixture
def dist_env(built_artifacts: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    _record, path = built_artifacts(arches_under_test()[0])
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(path.parent))
    return path


def text(result: Any) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


@pytest.mark.parametrize("persistent", [True, False], ids=["stdio", "exec"])
async def test_a_fastmcp_server_in_a_container_through_the_built_runtime(
    docker_engine: Any, python_image: str, mcp_volumes: Any, dist_env: Any, persistent: bool
) -> None:
    logs: list[str] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append(str(params.data))

    async def on_sampling(context: Any, params: CreateMessageRequestParams) -> CreateMessageResult:
        answer = TextContent(type="text", text="from the host")
        return CreateMessageResult(role="assistant", content=answer, model="host")

    with RunningContainer(docker_engine, python_image, volumes=mcp_volumes) as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(
            sandbox, options=InjectionOptions(persistent=persistent)
        )
        try:
            async with (
                sandbox_mcp_client(support, DEMO) as (read, write),
                ClientSession(
                    read, write, logging_callback=on_log, sampling_callback=on_sampling
                ) as session,
            ):
                await session.initialize()
                assert text(await session.call_tool("add", {"a": 40, "b": 2})) == "42"
                calls = [session.call_tool("slow", {"seconds": 1, "label": n}) for n in "xyz"]
                assert [text(r) for r in await asyncio.gather(*calls)] == ["x", "y", "z"]
                assert text(await session.call_tool("log", {"text": "from inside"})) == "logged"
                steps: list[float] = []

                async def on_progress(done: float, total: float | None, note: str | None) -> None:
                    steps.append(done)

                result = await session.call_tool(
                    "progress", {"steps": 3}, progress_callback=on_progress
                )
                assert text(result) == "done" and steps == [1, 2, 3]  # before the result
                asked = await session.call_tool("ask_client", {"question": "?"})
                assert text(asked) == "the client said: from the host"
                assert text(await session.call_tool("whoami", {})) == "0:0 /"
                with pytest.raises(McpError, match="not a JSON-RPC message"):
                    await session.call_tool("garbage", {})
                with pytest.raises(McpError, match=r"(?s)exited with code 3.*about to crash"):
                    await session.call_tool("crash", {})
            as_nobody = StdioServerParameters(**{**DEMO.model_dump(), "cwd": "/tmp"})
            async with (
                sandbox_mcp_client(support, as_nobody, user={"uid": 4242, "gid": 4242}) as (
                    read,
                    write,
                ),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert text(await session.call_tool("whoami", {})) == "4242:4242 /tmp"
        finally:
            await support.aclose()
            await forget_sandbox(sandbox)
    assert logs == ["from inside"]


async def test_a_missing_command_on_a_libc_free_image_is_a_clear_error(
    docker_engine: Any, dist_env: Any
) -> None:
    image = ensure_target_image(docker_engine, "busybox", arches_under_test()[0])
    with RunningContainer(docker_engine, image) as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox)
        try:
            with pytest.raises(ToolError, match="'my-mcp-server' not found"):
                async with sandbox_mcp_client(
                    support, StdioServerParameters(command="my-mcp-server")
                ):
                    pass
        finally:
            await support.aclose()
            await forget_sandbox(sandbox)


TASK = textwrap.dedent(
    """
    import os

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
    from inspect_ai.solver import generate, use_tools
    from inspect_ai.tool import mcp_server_sandbox as inspects_own, mcp_tools

    from sandbox_tools.inspect import mcp_server_sandbox as ours

    M = "mockllm/model"
    KIND = os.environ["MCP_SERVER_KIND"]
    PARAMS = dict(
        command="python3",
        args=["/opt/mcp-servers/demo_server.py"],
        env={"PYTHONPATH": "/opt/mcp-site"},
    )
    server = ours(**PARAMS) if KIND == "ours" else inspects_own(**PARAMS)
    SCRIPT = [
        ModelOutput.for_tool_call(M, "add", {"a": 20, "b": 22}),
        ModelOutput.for_tool_call(M, "slow", {"seconds": 0.1, "label": "done-slow"}),
        ModelOutput.from_content(M, "finished"),
    ]
    for output in SCRIPT:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


    @scorer(metrics=[accuracy()])
    def tools_answered():
        async def score(state, target: Target) -> Score:
            tools = [m.text for m in state.messages if m.role == "tool"]
            ok = tools == ["42", "done-slow"]
            return Score(value=CORRECT if ok else INCORRECT, explanation=repr(tools))

        return score


    @task
    def mcp_task():
        return Task(
            dataset=[Sample(input="add")],
            solver=[use_tools(mcp_tools(server, tools=["add", "slow"])), generate()],
            scorer=tools_answered(),
            model=get_model(M, custom_outputs=SCRIPT),
        )
    """
)


@pytest.mark.parametrize("kind", ["ours", "inspects_own"])
def test_mcp_tools_in_an_inspect_eval(
    python_image: str, mcp_site: Path, built_artifacts: Any, tmp_path: Path, kind: str
) -> None:
    from sandbox_tools.inspect.dropin import (
        INSTALL_STATE_ENV,
        INSTALL_STATE_USING_DEV,
        as_inspect_dev_runtime,
    )

    arch = Arch.parse(os.uname().machine)
    _record, artifact = built_artifacts(arch)
    servers = Path(__file__).parents[1] / "mcp_servers"
    (tmp_path / "mcp_task.py").write_text(TASK)
    config = tmp_path / "sandbox.json"
    volumes = [f"{mcp_site}:{MCP_SITE_MOUNT}:ro", f"{servers}:{MCP_SERVERS_MOUNT}:ro"]
    config.write_text(json.dumps({"image": python_image, "volumes": volumes}))
    env = {
        "MCP_SERVER_KIND": kind,
        "SANDBOX_TOOLS_DIST": str(artifact.parent),
        INSTALL_STATE_ENV: INSTALL_STATE_USING_DEV,  # inspect's own: our runtime in its place
    }
    with as_inspect_dev_runtime(artifact, arch):
        sample, _log = run_inspect_eval(
            tmp_path / "mcp_task.py", "--sandbox", f"docker_sdk:{config}", env=env
        )
    score = next(iter(sample["scores"].values()))
    assert score["value"] == "C", score["explanation"]
