"""MCP `call_tool` round trip for a trivial tool, side by side in one run (a benchmark).

- local: the `mcp` SDK's own stdio_client with the server on this machine (the floor);
- ours, stdio: the server in a Debian container, through our persistent channel;
- ours, exec: the same, one `docker exec` per call;
- inspect: inspect_ai's `mcp_server_sandbox()` on inspect's own runtime, in an
  `inspect eval` (docker_sdk sandbox, same image), timed inside the solver.

The server is tests/mcp_servers/demo_server.py; the container gets the `mcp` package the
way the tests do (installed on the host, mounted read-only).
Usage: .venv/bin/python benchmarks/mcp_round_trip.py [--runs N] [--dist DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from rich.console import Console
from rich.table import Table

from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.mcp_client import sandbox_mcp_client
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_image

ROOT = Path(__file__).parents[1]
SERVERS = ROOT / "tests" / "mcp_servers"
SITE = "/opt/mcp-site"
IN_CONTAINER = StdioServerParameters(
    command="python3", args=["/opt/mcp-servers/demo_server.py"], env={"PYTHONPATH": SITE}
)

INSPECT_TASK = textwrap.dedent(
    """
    import os, time
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import solver
    from inspect_ai.tool import ToolDef, mcp_server_sandbox

    @solver
    def measure():
        async def solve(state, generate):
            server = mcp_server_sandbox(
                command="python3", args=["/opt/mcp-servers/demo_server.py"],
                env={"PYTHONPATH": "/opt/mcp-site"},
            )
            async with server:
                add = next(t for t in await server.tools() if ToolDef(t).name == "add")
                await add(a=1, b=2)
                times = []
                for _ in range(int(os.environ["BENCH_RUNS"])):
                    started = time.perf_counter()
                    await add(a=1, b=2)
                    times.append((time.perf_counter() - started) * 1000)
            state.store.set("times", times)
            return state
        return solve

    @task
    def mcp_bench():
        return Task(dataset=[Sample(input="x")], solver=measure())
    """
)


async def timed_calls(session: ClientSession, runs: int) -> list[float]:
    await session.initialize()
    await session.call_tool("add", {"a": 1, "b": 2})  # warm
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await session.call_tool("add", {"a": 1, "b": 2})
        times.append((time.perf_counter() - started) * 1000)
    return times


async def local(runs: int) -> list[float]:
    server = StdioServerParameters(command=sys.executable, args=[str(SERVERS / "demo_server.py")])
    with open(os.devnull, "w") as quiet:
        async with (
            stdio_client(server, errlog=quiet) as (read, write),
            ClientSession(read, write) as session,
        ):
            return await timed_calls(session, runs)


async def ours(container: Any, client: Any, options: InjectionOptions, runs: int) -> list[float]:
    sandbox = container.sandbox
    support = await tool_support_sandbox(sandbox, options=options)
    try:
        async with (
            sandbox_mcp_client(support, IN_CONTAINER) as (read, write),
            ClientSession(read, write) as session,
        ):
            return await timed_calls(session, runs)
    finally:
        await support.aclose()
        await forget_sandbox(sandbox)


def inspects(image: str, site: Path, runs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "mcp_bench.py").write_text(INSPECT_TASK)
        config = work / "sandbox.json"
        volumes = [f"{site}:{SITE}:ro", f"{SERVERS}:/opt/mcp-servers:ro"]
        config.write_text(json.dumps({"image": image, "volumes": volumes}))
        env = {**os.environ, "BENCH_RUNS": str(runs), "INSPECT_LOG_DIR": str(work / "logs")}
        env.pop("INSPECT_SANDBOX_TOOLS_INSTALL_STATE", None)  # inspect's shipped runtime
        command = [sys.executable, "-m", "inspect_ai", "eval", "mcp_bench.py"]
        command += ["--model", "mockllm/model", "--sandbox", f"docker_sdk:{config}"]
        command += ["--log-format", "json", "--display", "none"]
        done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"inspect eval failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        (log_file,) = (work / "logs").glob("*.json")
        (sample,) = json.loads(log_file.read_text())["samples"]
        if sample.get("error"):
            raise SystemExit(f"inspect: {sample['error']['message']}")
        times: list[float] = sample["store"]["times"]
        return times


def mcp_site() -> Path:
    """The same host-installed `mcp` the tests mount (see tests/integration/conftest.py)."""
    pin = next(
        line
        for line in (ROOT / "constraints-dev.txt").read_text().splitlines()
        if line.startswith("mcp==")
    )
    site = Path.home() / ".cache" / "sandbox-tools" / f"mcp-site-{pin.split('==')[1]}"
    if not site.is_dir():
        raise SystemExit(f"{site} is missing: run tests/integration/test_mcp_in_containers.py once")
    return site


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    default_dist = os.environ.get("SANDBOX_TOOLS_DIST", "dist")
    parser.add_argument("--dist", type=Path, default=Path(default_dist))
    args = parser.parse_args()
    os.environ["SANDBOX_TOOLS_DIST"] = str(args.dist.resolve())
    arch = Arch.parse(os.uname().machine)
    client = docker_client()
    image = ensure_image(client, RootfsRecipe(suite="bookworm", arch=arch, include=("python3",)))
    site = mcp_site()
    volumes = {
        str(site): {"bind": SITE, "mode": "ro"},
        str(SERVERS): {"bind": "/opt/mcp-servers", "mode": "ro"},
    }
    results: dict[str, list[float]] = {"local stdio server (floor)": asyncio.run(local(args.runs))}
    with RunningContainer(client, image, volumes=volumes) as container:
        for name, options in (
            ("ours, persistent channel", InjectionOptions()),
            ("ours, exec per call", InjectionOptions(persistent=False)),
        ):
            results[name] = asyncio.run(ours(container, client, options, args.runs))
    results["inspect's mcp_server_sandbox, its runtime"] = inspects(image, site, args.runs)
    table = Table(title=f"MCP call_tool round trip, ms (median and p90 of {args.runs})")
    for column in ("path", "median", "p90"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name, times in results.items():
        p90 = statistics.quantiles(times, n=10)[-1]
        table.add_row(name, f"{statistics.median(times):.1f}", f"{p90:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
