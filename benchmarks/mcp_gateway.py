"""`tools mcp` against the host library it is built on, side by side in one run.

- first call: `sandbox_create` of a Debian image (the container made, the runtime
  injected) and the first `bash` call (the shell started), through the gateway;
- per call: `text_editor view` of a small file and `bash` running `true`, through the
  gateway (the `mcp` SDK's stdio client, the server a child process) and through the
  library directly (`text_editor` / `bash_session` on a handle of the same container);
  the difference is what the gateway adds to a call;
- a bare `docker exec true` as the floor of anything that runs in a container.

Usage: .venv/bin/python benchmarks/mcp_gateway.py [--calls N] [--dist DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from rich.console import Console
from rich.table import Table

from sandbox_tools.injector.inject import Injector
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.tool_clients import bash_session, start_bash_session, text_editor
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.docker import DockerSandbox
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import RootfsStore, ensure_image

FILE = "/tmp/bench.txt"


async def timed(calls: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    """Milliseconds of each of `calls` calls, after two to warm up."""
    for _ in range(2):
        await call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def row(table: Table, what: str, times: list[float]) -> None:
    ordered = sorted(times)
    p90 = ordered[max(0, int(len(ordered) * 0.9) - 1)]
    table.add_row(what, f"{statistics.median(times):.1f}", f"{p90:.1f}")


async def main(calls: int, dist: Path | None) -> None:
    client = docker_client()
    arch = Arch.parse(os.uname().machine)
    image = ensure_image(
        client, RootfsRecipe(suite="bookworm", arch=arch), store=RootfsStore.from_cascade()
    )
    if dist is not None:  # the gateway and the library's handle inject the same build
        os.environ["SANDBOX_TOOLS_DIST"] = str(dist)
    env = dict(os.environ)
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "sandbox_tools.cli", "mcp"], env=env
    )
    table = Table(title=f"tools mcp vs the library, {calls} calls each (ms)")
    table.add_column("call")
    table.add_column("median ms", justify="right")
    table.add_column("p90 ms", justify="right")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        started = time.perf_counter()
        made = await session.call_tool("sandbox_create", {"image": image})
        create_ms = (time.perf_counter() - started) * 1000
        assert not made.isError and made.structuredContent is not None, made
        sandbox = made.structuredContent["sandbox"]
        started = time.perf_counter()
        first = await session.call_tool("bash", {"sandbox": sandbox, "input": "true\n"})
        first_bash_ms = (time.perf_counter() - started) * 1000
        assert not first.isError, first
        await session.call_tool(
            "text_editor",
            {"sandbox": sandbox, "command": "create", "path": FILE, "file_text": "one\ntwo\n"},
        )
        container = client.containers.get(made.structuredContent["container"])
        direct = DockerSandbox(container, client)
        injector = Injector(InjectionOptions())
        support = await injector.tool_support(direct)
        shell, _ = await start_bash_session(support.client)

        async def via_gateway_view() -> None:
            answer = await session.call_tool(
                "text_editor", {"sandbox": sandbox, "command": "view", "path": FILE}
            )
            assert not answer.isError

        async def via_gateway_bash() -> None:
            answer = await session.call_tool("bash", {"sandbox": sandbox, "input": "true\n"})
            assert not answer.isError

        async def direct_view() -> None:
            await text_editor(support.client, "view", FILE)

        async def direct_bash() -> None:
            await bash_session(support.client, shell, "true\n")

        async def bare_exec() -> None:
            await asyncio.to_thread(container.exec_run, ["true"])

        results = {
            "view, gateway": await timed(calls, via_gateway_view),
            "view, library": await timed(calls, direct_view),
            "bash true, gateway": await timed(calls, via_gateway_bash),
            "bash true, library": await timed(calls, direct_bash),
            "bare docker exec true": await timed(calls, bare_exec),
        }
        await injector.aclose()
    table.add_row("sandbox_create (container + injection), once", f"{create_ms:.0f}", "")
    table.add_row("first bash call (the shell started), once", f"{first_bash_ms:.0f}", "")
    for what, times in results.items():
        row(table, what, times)
    for tool in ("view", "bash true"):
        added = statistics.median(results[f"{tool}, gateway"]) - statistics.median(
            results[f"{tool}, library"]
        )
        table.add_row(f"{tool}: the gateway adds (median)", f"{added:.1f}", "")
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument(
        "--dist", type=Path, default=None, help="a local dist/ (SANDBOX_TOOLS_DIST)"
    )
    arguments = parser.parse_args()
    asyncio.run(main(arguments.calls, arguments.dist))
