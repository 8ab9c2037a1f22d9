"""Many sandboxes from one host (a benchmark, not a test).

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
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import connect_engine
from sandbox_tools.sandboxes.images import ensure_image
from sandbox_tools.settings import load_settings


def host_cost() -> tuple[float, int, int]:
    """This process's RSS (MiB), OS threads and open file descriptors."""
    status = Path("/proc/self/status").read_text().splitlines()
    value = dict(line.split(":", 1) for line in status if ":" in line)
    value = {key: text.split()[0] if text.split() else "" for key, text in value.items()}
    return int(value["VmRSS"]) / 1024, int(value["Threads"]), len(os.listdir("/proc/self/fd"))


async def most_threads(until: float, seen: list[int]) -> None:
    """The peak thread count, sampled: the count at the end hides threads per call."""
    while time.monotonic() < until:
        seen.append(host_cost()[1])
        await asyncio.sleep(0.1)


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
def containers(engines: list[tuple[Any, str]], n: int) -> Iterator[list[tuple[Any, Any]]]:
    """N running containers dealt round-robin across the engines, with their clients."""
    with contextlib.ExitStack() as stack:
        yield [
            (client, stack.enter_context(RunningContainer(client, image)))
            for client, image in (engines[i % len(engines)] for i in range(n))
        ]


async def run(n: int, seconds: float, engines: list[tuple[Any, str]]) -> dict[str, Any]:
    with containers(engines, n) as boxes:
        sandboxes = [box.sandbox for _, box in boxes]
        started = time.perf_counter()
        threads: list[int] = []
        sampler = asyncio.create_task(most_threads(time.monotonic() + 3600, threads))
        supports = await asyncio.gather(*(tool_support_sandbox(s) for s in sandboxes))
        injected = time.perf_counter() - started
        latencies: dict[str, list[float]] = {
            "exec_remote true": [],
            "bash_session echo": [],
            "text_editor view": [],
        }
        until = time.monotonic() + seconds
        await asyncio.gather(*(steady_load(s, until, latencies) for s in supports))
        rss, _, fds = host_cost()
        sampler.cancel()
        for support, sandbox in zip(supports, sandboxes, strict=True):
            await support.aclose()
            await forget_sandbox(sandbox)
    total = sum(len(v) for v in latencies.values())
    return {
        "injected": injected,
        "calls_per_s": total / seconds,
        "latencies": latencies,
        "rss": rss,
        "threads": max(threads),
        "fds": fds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--engine", action="append", help="default, or a DOCKER_HOST URL")
    parser.add_argument("--seconds", type=float, default=20.0)
    default_dist = os.environ.get("SANDBOX_TOOLS_DIST", "dist")
    parser.add_argument("--dist", type=Path, default=Path(default_dist))
    args = parser.parse_args()
    os.environ["SANDBOX_TOOLS_DIST"] = str(args.dist.resolve())
    recipe = RootfsRecipe(suite="bookworm", arch=Arch.parse(os.uname().machine))
    limit = load_settings().engine_concurrency  # this script is an entry point
    engines = []
    for spec in args.engine or ["default"]:
        engine = connect_engine(spec, limit)
        if not engine.available:
            raise SystemExit(f"engine {spec}: {engine.error}")
        engines.append((engine.client, ensure_image(engine.client, recipe)))
    title = f"many sandboxes on {len(engines)} engine(s), {args.seconds:g} s of steady calls"
    table = Table(title=f"{title}, at most {limit} execs at once per engine")
    columns = ["N", "inject all (s)", "calls/s"]
    kinds = ["exec_remote true", "bash_session echo", "text_editor view"]
    columns += [f"{k} p50/p99 ms" for k in kinds] + ["host RSS MiB", "peak threads", "fds"]
    for column in columns:
        table.add_column(column, justify="right")
    for n in args.n:
        result = asyncio.run(run(n, args.seconds, engines))
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
