"""The browser for inspect tasks, in real `inspect eval`s (mockllm plays the agent) on a
busybox image without libc, as uid 1000, with a read-only root, an exec tmpfs and no
network, the site served by busybox httpd inside the container:

- `web_browser()`: README.md's task run as written (the agent reads each page's tree,
  opens the site, follows a link, goes back and submits the form); the log holds the
  tool results and the transcript the browser's install, with its seconds;
- `browser_mcp_server()` with `mcp_tools()`, and `web_browser(screenshots=True)`, in one
  sample (one container, one install of the add-on): navigate and snapshot through MCP,
  and a page with its PNG;
- the plain-Python route to `browser-mcp`: `ensure_browser` then `sandbox_mcp_client`
  with the runtime's executable, as docs/INJECTION.md shows it.

The runtime and the add-on come from the checkout's dist/ (built on demand). Each fresh
container costs the add-on's install, about 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.docs.blocks import BLOCKS, code_blocks
from tests.support import run_inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.timeout(1800)]
HOST_ARCH = Arch.parse(os.uname().machine)

# The README's task (its block holds this line), and docs/INSPECT.md's scripted agent
# (mockllm: each step reads the tree the last tool returned and picks the element by role
# and name, as a model does) with its offline image and `inspect eval` line.
README_TASK = "def browse(image"
SCRIPTED_AGENT = "def agent(input, tools, tool_choice, config):"
OFFLINE_IMAGE = "busybox:offline"

# One sample, both other routes: the MCP server's tools (listed by mcp_tools) and
# web_browser(screenshots=True) share the container and the add-on's one install.
MCP_AND_SCREENSHOTS_TASK = textwrap.dedent(
    """
    from inspect_ai import Task, task
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.tool import mcp_tools
    from inspect_ai.util import sandbox

    from sandbox_tools.inspect import DockerSdkConfig, browser_mcp_server, web_browser

    PAGE = "<title>Stock</title><h1>Stock level</h1><p>17 teapots left.</p>"
    M = "mockllm/model"
    SCRIPT = [
        ModelOutput.for_tool_call(M, "browser_navigate", {"url": "http://127.0.0.1:8000/"}),
        ModelOutput.for_tool_call(M, "browser_snapshot", {}),
        ModelOutput.for_tool_call(M, "web_browser_go", {"url": "http://127.0.0.1:8000/"}),
        ModelOutput.for_tool_call(M, "submit", {"answer": "17"}),
    ]
    for output in SCRIPT:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


    @solver
    def serve_page():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            write = ["sh", "-c", "mkdir -p /tmp/site && cat > /tmp/site/index.html"]
            await sandbox().exec(write, input=PAGE)
            await sandbox().exec(["busybox", "httpd", "-p", "127.0.0.1:8000", "-h", "/tmp/site"])
            return state

        return solve


    @task
    def mcp_and_screenshots(image: str):
        # react() holds the MCP connection open for the whole run: one server, one
        # browser, so the snapshot sees the page the navigation opened.
        mcp = mcp_tools(browser_mcp_server(), tools=["browser_navigate", "browser_snapshot"])
        return Task(
            dataset=[Sample(input="How many teapots are left?", target="17")],
            setup=serve_page(),
            solver=react(tools=[mcp, *web_browser(screenshots=True)]),
            model=get_model(M, custom_outputs=SCRIPT),
            sandbox=("docker_sdk", DockerSdkConfig(image=image, user="1000:1000",
                                                   read_only=True, tmpfs={"/tmp": "exec"})),
        )
    """
)


@pytest.fixture(scope="module")
def busybox(docker_engine: Any) -> str:
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    return ensure_busybox_image(docker_engine, HOST_ARCH)


def _tool_results(sample: dict[str, Any]) -> list[Any]:
    """Each tool message's content as the log holds it: a string, or a list of items."""
    return [message["content"] for message in sample["messages"] if message["role"] == "tool"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(item.get("text", "") for item in content if item.get("type") == "text")


def _browser_install(sample: dict[str, Any]) -> dict[str, Any]:
    """The transcript's one event about the browser add-on."""
    (data,) = [
        event["data"]
        for event in sample["events"]
        if event.get("event") == "info"
        and event.get("source") == "sandbox-tools"
        and "browser_addon" in event.get("data", {})
    ]
    return dict(data)


def test_the_readme_browsing_task_in_busybox_offline_as_uid_1000(tmp_path: Path) -> None:
    """User path: README.md's "A browsing agent" task, as written, and docs/INSPECT.md's
    scripted agent beside it, run by that page's own commands: the image made from
    Debian's static busybox, then `inspect eval` with mockllm as the agent."""
    (task,) = [block for block in BLOCKS if README_TASK in block]
    (agent,) = [block for block in BLOCKS if SCRIPTED_AGENT in block]
    (commands,) = [
        b.source for b in code_blocks() if b.kind == "shell" and OFFLINE_IMAGE in b.source
    ]
    (tmp_path / "browse.py").write_text(task)
    (tmp_path / "scripted.py").write_text(agent)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "INSPECT_LOG_DIR": str(tmp_path / "logs"),
            "INSPECT_LOG_FORMAT": "json",  # read below without inspect
        },
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = (tmp_path / "logs").glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    (sample,) = log["samples"]
    go, click, back, submitted = map(_text, _tool_results(sample))
    assert 'heading "Orders"' in go and 'textbox "Order number"' in go, go
    assert 'heading "Help"' in click and "press Enter" in click, click
    assert 'heading "Orders"' in back, back
    assert 'heading "Order 42 has shipped"' in submitted, submitted
    score = next(iter(sample["scores"].values()))
    assert score["value"] == "C", (score, sample["output"])
    install = _browser_install(sample)
    assert install["browser_addon"].startswith("sandbox-tools-browser-")
    # docker_sdk made the container with the add-on's checked tree mounted: nothing sent.
    assert install["reused"] is False and install["transfer"] == "mount", install
    assert install["sent_bytes"] == 0 and 0 <= install["seconds"] < 600, install


@pytest.fixture(scope="module")
def mcp_and_screenshots(busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One eval, read by the two tests below."""
    directory = tmp_path_factory.mktemp("mcp-and-screenshots")
    (directory / "task.py").write_text(MCP_AND_SCREENSHOTS_TASK)
    sample, _log = run_inspect_eval(
        directory / "task.py", "-T", f"image={busybox}", env={}, timeout=1200
    )
    yield sample


def test_browser_mcp_server_with_mcp_tools_navigates_and_snapshots(
    mcp_and_screenshots: dict[str, Any],
) -> None:
    navigated, snapshot, _page = _tool_results(mcp_and_screenshots)
    for result in (navigated, snapshot):
        text = _text(result)
        assert "URL: http://127.0.0.1:8000/" in text, text
        assert 'heading "Stock level"' in text and "17 teapots left." in text, text
    install = _browser_install(mcp_and_screenshots)  # once for both routes
    assert install["reused"] is False and install["transfer"] == "mount", install


def test_screenshots_add_the_page_as_an_image(mcp_and_screenshots: dict[str, Any]) -> None:
    _navigated, _snapshot, page = _tool_results(mcp_and_screenshots)
    assert isinstance(page, list), page
    kinds = [item["type"] for item in page]
    assert kinds[-1] == "image" and set(kinds[:-1]) == {"text"}, kinds
    assert 'heading "Stock level"' in _text(page)
    image = page[-1]["image"]  # the log keeps it apart, as an attachment
    image = mcp_and_screenshots["attachments"].get(image.removeprefix("attachment://"), image)
    assert image.startswith("data:image/png;base64,iVBORw0KGgo"), image[:60]  # a PNG


async def test_browser_mcp_from_plain_python(busybox: str, docker_engine: Any) -> None:
    """docs/INJECTION.md's host route to `browser-mcp`: the add-on first, then the
    runtime's executable as the MCP server, spoken to with the SDK's ClientSession."""
    from mcp import ClientSession, StdioServerParameters

    from sandbox_tools.injector.addon_delivery import ensure_browser
    from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
    from sandbox_tools.injector.mcp_client import sandbox_mcp_client
    from sandbox_tools.sandboxes.containers import RunningContainer

    with RunningContainer(
        docker_engine,
        busybox,
        platform=HOST_ARCH.platform,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": "exec"},
        user="1000:1000",
    ) as container:
        sandbox = container.sandbox
        page = "<h1>Inventory</h1><p>3 kettles.</p>"
        written = await sandbox.exec(
            ["sh", "-c", "mkdir -p /tmp/site && cat > /tmp/site/index.html"], input=page
        )
        assert written.returncode == 0, written.stderr
        served = await sandbox.exec(["busybox", "httpd", "-p", "127.0.0.1:8000", "-h", "/tmp/site"])
        assert served.returncode == 0, served.stderr

        support = await tool_support_sandbox(sandbox)
        await ensure_browser(support)
        server = StdioServerParameters(command=support.exe, args=["browser-mcp"])
        async with (
            sandbox_mcp_client(support, server) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            result = await session.call_tool("browser_navigate", {"url": "http://127.0.0.1:8000/"})
        text = "".join(getattr(item, "text", "") for item in result.content)
        assert not result.isError and 'heading "Inventory"' in text, text
        await forget_sandbox(sandbox)
