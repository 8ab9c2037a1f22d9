"""exec_remote latency, measured side by side in one run (a benchmark, not a test).

1. Exit-to-Completed: time from a process's exit (it prints a timestamp as its last act)
   until the host sees `Completed`, with long polling vs a fixed 0.5 s poll loop.
2. Round trip of one `version` call: the persistent stdio channel vs one `exec` per
   call vs a bare `docker exec true` (the floor of any exec-per-call design).

Runs locally and in a container of the offline Debian image with the runtime mounted
from source. Usage: .venv/bin/python benchmarks/exec_remote_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    RuntimeClient,
    StdioRuntimeClient,
)
from sandbox_tools.injector.source_runtime import (
    SOURCE_MOUNT,
    local_source_runtime,
    mounted_source_runtime,
    package_parent,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_image
from sandbox_tools.sandboxes.local import LocalSandbox

# The command's last act is to print the wall-clock time of its exit (same clock as ours:
# containers share the host kernel's clock).
EXIT_STAMP = "sleep 0.2; date +%s.%N"


async def exit_latency_long_poll(client: RuntimeClient) -> float:
    process = await exec_remote(client, EXIT_STAMP, ExecRemoteOptions(poll_interval=5))
    completed = await process.wait()
    return time.time() - float(completed.stdout.strip())


async def exit_latency_fixed_poll(client: RuntimeClient, interval: float = 0.5) -> float:
    """The classic loop: poll without waiting, sleep a fixed interval, repeat."""
    pid = (await client.call("exec_remote_start", {"command": EXIT_STAMP}))["pid"]
    ack, stdout = 0, ""
    while True:
        result = await client.call("exec_remote_poll", {"pid": pid, "ack_seq": ack})
        ack, stdout = result["seq"], stdout + result["stdout"]
        if result["state"] != "running":
            return time.time() - float(stdout.strip())
        await asyncio.sleep(interval)


async def sample(runs: int, measure: Callable[[], Awaitable[float]]) -> list[float]:
    await measure()  # warm-up: server start, page cache
    return [await measure() for _ in range(runs)]


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


def row(table: Table, where: str, what: str, values: list[float]) -> None:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    table.add_row(where, what, f"{statistics.median(values) * 1000:.1f}", f"{p90 * 1000:.1f}")


async def bench_target(
    where: str,
    sandbox: Sandbox,
    launch_command: list[str],
    env: dict[str, str],
    runs: int,
    latency: Table,
    round_trip: Table,
    bare_exec: Callable[[], Awaitable[Any]] | None,
) -> None:
    stdio = StdioRuntimeClient(sandbox, launch_command, env=env)
    per_call = ExecRuntimeClient(sandbox, launch_command, env=env)
    try:
        row(
            latency,
            where,
            "long poll (wait_ms)",
            await sample(runs, lambda: exit_latency_long_poll(stdio)),
        )
        row(
            latency,
            where,
            "fixed 0.5 s poll loop",
            await sample(runs, lambda: exit_latency_fixed_poll(stdio)),
        )
        row(
            round_trip,
            where,
            "version via persistent stdio channel",
            await sample(runs, lambda: timed(lambda: stdio.call("version"))),
        )
        row(
            round_trip,
            where,
            "version via one exec per call",
            await sample(runs, lambda: timed(lambda: per_call.call("version"))),
        )
        if bare_exec is not None:
            row(
                round_trip,
                where,
                "bare `docker exec true`",
                await sample(runs, lambda: timed(bare_exec)),
            )
        await stdio.call("sandbox_tools_shutdown")
    finally:
        await stdio.aclose()


async def main(runs: int) -> None:
    latency = Table(title="exit -> Completed seen by the host (ms)")
    round_trip = Table(title="round trip of one call (ms)")
    for table in (latency, round_trip):
        for column in ("where", "how", "median", "p90"):
            table.add_column(column)

    with tempfile.TemporaryDirectory(prefix="st-bench-") as server_dir:
        launch = local_source_runtime(server_dir)
        await bench_target(
            "local", LocalSandbox(), launch.command, launch.env, runs, latency, round_trip, None
        )

    client = docker_client()
    recipe = RootfsRecipe(
        suite="bookworm", arch=Arch.parse(os.uname().machine), include=("python3",)
    )
    image = ensure_image(client, recipe)
    mounts = {str(package_parent()): {"bind": SOURCE_MOUNT, "mode": "ro"}}
    with RunningContainer(client, image, volumes=mounts) as container:
        sandbox = container.sandbox
        launch = mounted_source_runtime()
        await bench_target(
            "docker",
            sandbox,
            launch.command,
            launch.env,
            runs,
            latency,
            round_trip,
            lambda: sandbox.exec(["true"]),
        )

    console = Console()
    console.print(latency)
    console.print(round_trip)
    console.print(f"{runs} runs each after one warm-up; runtime run from source (python3).")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    asyncio.run(main(parser.parse_args().runs))
