"""Model-proxy overhead, side by side in one run (a benchmark, not a test).

A fake model API on the host's loopback (tests/proxy/upstream.py, no artificial delay)
is called by the same stdlib client (tests/proxy/client.py): directly from the host
(the floor), and from inside an offline Debian container through our proxy, answered by
the host's `forward_to` handler over the persistent channel and over one exec per call.
Per request: the latency of a plain chat completion, and the time to the first streamed
event (TTFT). inspect_ai's file-queue bridge, for comparison, waits for its host poll
(every 2 s by default): not run here.

Usage: .venv/bin/python benchmarks/model_proxy_latency.py [--runs N] [--dist DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.model_proxy import ModelProxy, forward_to
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_image

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
from tests.proxy.upstream import FakeUpstream  # noqa: E402

CLIENT = ROOT / "tests" / "proxy" / "client.py"


async def direct(upstream: FakeUpstream, runs: int) -> dict[str, list[float]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CLIENT),
        "bench",
        str(upstream.port),
        str(runs),
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await process.communicate()
    result: dict[str, list[float]] = json.loads(stdout)
    return result


async def through_proxy(
    container: Any, client: Any, upstream: FakeUpstream, options: InjectionOptions, runs: int
) -> dict[str, list[float]]:
    sandbox = container.sandbox
    support = await tool_support_sandbox(sandbox, options=options)
    try:
        async with ModelProxy(support, forward_to(upstream.url)):
            done = await sandbox.exec(
                ["python3", "/opt/proxy/client.py", "bench", "13131", str(runs)], timeout=600
            )
            result: dict[str, list[float]] = json.loads(done.stdout)
            return result
    finally:
        await support.aclose()
        await forget_sandbox(sandbox)


async def measure(runs: int) -> dict[str, dict[str, list[float]]]:
    client = docker_client()
    arch = Arch.parse(os.uname().machine)
    image = ensure_image(client, RootfsRecipe(suite="bookworm", arch=arch, include=("python3",)))
    volumes = {str(CLIENT.parent): {"bind": "/opt/proxy", "mode": "ro"}}
    results: dict[str, dict[str, list[float]]] = {}
    async with FakeUpstream(delay=0.0) as upstream:
        results["direct from the host (floor)"] = await direct(upstream, runs)
        with RunningContainer(client, image, volumes=volumes, network_mode="none") as box:
            for name, options in (
                ("proxy, persistent channel", InjectionOptions()),
                ("proxy, exec per call", InjectionOptions(persistent=False)),
            ):
                results[name] = await through_proxy(box, client, upstream, options, runs)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    default_dist = os.environ.get("SANDBOX_TOOLS_DIST", "dist")
    parser.add_argument("--dist", type=Path, default=Path(default_dist))
    args = parser.parse_args()
    os.environ["SANDBOX_TOOLS_DIST"] = str(args.dist.resolve())
    results = asyncio.run(measure(args.runs))
    floor = results["direct from the host (floor)"]
    table = Table(title=f"model proxy, ms per request (median of {args.runs})")
    for column in ("path", "latency", "added", "TTFT", "added "):
        table.add_column(column, justify="left" if column == "path" else "right")
    for name, times in results.items():
        latency, ttft = statistics.median(times["latency_ms"]), statistics.median(times["ttft_ms"])
        added = latency - statistics.median(floor["latency_ms"])
        added_ttft = ttft - statistics.median(floor["ttft_ms"])
        table.add_row(name, f"{latency:.1f}", f"{added:.1f}", f"{ttft:.1f}", f"{added_ttft:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
