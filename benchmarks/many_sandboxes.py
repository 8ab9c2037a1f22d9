"""Many sandboxes from one host (a benchmark, not a test; issue 16).

For each N: N fresh Debian containers, injected concurrently (persistent channel), then a
steady mix of tool calls in all of them for a fixed time (exec_remote of `true`, a
bash_session echo, a text_editor view). Reported per N: injection wall time, calls per
second, p50/p99 per call kind, and the host's cost: RSS, threads and open file
descriptors at the end of the run (this process: the host side of every sandbox).

Usage: .venv/bin/python benchmarks/many_sandboxes.py [--n 8 16 32] [--seconds 20] [--dist DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.injector.exec_remote import exec_remote
from sandbox_tools.injector.inject import ToolSupport, forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.docker import DockerSandbox, docker_client, running_container
from sandbox_tools.sandboxes.images import RootfsRecipe, ensure_image


def host_cost() -> tuple[float, int, int]:
    """This process's RSS (MiB), threads and open file descriptors."""
    rss_kib = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return rss_kib / 1024, threading.active_count(), len(os.listdir("/proc/self/fd"))


async def steady_load(
    support: ToolSupport, until: float, latencies: dict[str, list[float]]
) -> None:
    session = await new_bash_session(support.client)
    await text_editor(support.client, "create", "/tmp/view.txt", file_text="a\nb\nc\n")
    calls = {
        "exec_remote true": lambda: exec_remote(support.client, "true", stream=False),
        "bash_session echo": lambda: bash_session(support.client, session, "echo hi\n"),
        "text_editor view": lambda: text_editor(support.client, "view", "/tmp/view.txt"),
    }
    while time.monotonic() < until:
        for kind, call in calls.items():
            started = time.perf_counter()
            await call()
            latencies[kind].append(time.perf_counter() - started)


@contextlib.contextmanager
def containers(client: Any, image: str, n: int) -> Iterator[list[Any]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(running_container(client, image)) for _ in range(n)]


async def run(n: int, seconds: float, client: Any, image: str) -> dict[str, Any]:
    with containers(client, image, n) as boxes:
        sandboxes = [DockerSandbox(box, client) for box in boxes]
        started = time.perf_counter()
        supports = await asyncio.gather(*(tool_support_sandbox(s) for s in sandboxes))
        injected = time.perf_counter() - started
        latencies: dict[str, list[float]] = {
            "exec_remote true": [],
            "bash_session echo": [],
            "text_editor view": [],
        }
        until = time.monotonic() + seconds
        await asyncio.gather(*(steady_load(s, until, latencies) for s in supports))
        rss, threads, fds = host_cost()
        for support, sandbox in zip(supports, sandboxes, strict=True):
            await support.aclose()
            await forget_sandbox(sandbox)
    total = sum(len(v) for v in latencies.values())
    return {
        "injected": injected,
        "calls_per_s": total / seconds,
        "latencies": latencies,
        "rss": rss,
        "threads": threads,
        "fds": fds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--seconds", type=float, default=20.0)
    default_dist = os.environ.get("SANDBOX_TOOLS_DIST", "dist")
    parser.add_argument("--dist", type=Path, default=Path(default_dist))
    args = parser.parse_args()
    os.environ["SANDBOX_TOOLS_DIST"] = str(args.dist.resolve())
    client = docker_client()
    image = ensure_image(
        client, RootfsRecipe(suite="bookworm", arch=Arch.parse(os.uname().machine))
    )
    table = Table(title=f"many sandboxes, {args.seconds:g} s of steady calls each")
    columns = ["N", "inject all (s)", "calls/s"]
    kinds = ["exec_remote true", "bash_session echo", "text_editor view"]
    columns += [f"{k} p50/p99 ms" for k in kinds] + ["host RSS MiB", "threads", "fds"]
    for column in columns:
        table.add_column(column, justify="right")
    for n in args.n:
        result = asyncio.run(run(n, args.seconds, client, image))
        row = [str(n), f"{result['injected']:.1f}", f"{result['calls_per_s']:.0f}"]
        for kind in kinds:
            values = sorted(result["latencies"][kind])
            p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
            row.append(f"{statistics.median(values) * 1000:.0f}/{p99 * 1000:.0f}")
        row += [f"{result['rss']:.0f}", str(result["threads"]), str(result["fds"])]
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
