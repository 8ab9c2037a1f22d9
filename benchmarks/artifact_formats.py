"""Per-call cost and size of each artifact format, side by side in one container.

For every artifact in dist/ of this machine's architecture (portable, staticx), and for
the runtime run from source with the container's python3: the time of one
`<runtime> exec version` through the docker provider, next to a bare `true` through
the same path (the floor of any exec-per-call design). Plus each artifact's size, raw
and gzip -9. Usage: .venv/bin/python benchmarks/artifact_formats.py [--runs N] [--dist DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandbox_tools.artifacts import read_build_records
from sandbox_tools.injector.source_runtime import (
    SOURCE_MOUNT,
    mounted_source_runtime,
    package_parent,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_image

REQUEST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "version"})


async def per_call_ms(
    sandbox: DockerSandbox, cmd: list[str], env: dict[str, str], runs: int
) -> list[float]:
    first = await sandbox.exec(cmd, env=env)  # warm-up: unpack, start the server
    if first.returncode != 0:
        raise SystemExit(f"{cmd} failed: {first.stderr.decode()[-500:]}")
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await sandbox.exec(cmd, env=env)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def main(runs: int, dist: Path) -> None:
    arch = Arch.parse(os.uname().machine)
    records = [r for r in read_build_records(dist) if r.platform == arch.platform]
    if not records:
        raise SystemExit(f"no {arch.platform} artifacts in {dist}; run `tools build` first")
    client = docker_client()
    image = ensure_image(client, RootfsRecipe(suite="bookworm", arch=arch, include=("python3",)))
    mounts = {
        str(package_parent()): {"bind": SOURCE_MOUNT, "mode": "ro"},
        str(dist.resolve()): {"bind": "/dist", "mode": "ro"},
    }
    timing = Table(title=f"one call, per exec, in a Debian bookworm container ({arch.value})")
    for column in ("what runs per call", "median ms", "p90 ms", "x bare exec"):
        timing.add_column(column)
    sizes = Table(title="artifact size")
    for column in ("artifact", "format", "size", "gzip -9"):
        sizes.add_column(column)

    with RunningContainer(client, image, volumes=mounts) as container:
        sandbox = container.sandbox
        rows: list[tuple[str, list[float]]] = []
        rows.append(("bare `true` (the floor)", await per_call_ms(sandbox, ["true"], {}, runs)))
        for record in sorted(records, key=lambda r: r.format):
            install = f"/opt/bench-{record.format.value}"
            await sandbox.exec(
                [
                    "sh",
                    "-c",
                    f"mkdir -p {install} && cp /dist/{record.name} {install}/sandbox-tools",
                ]
            )
            samples = await per_call_ms(
                sandbox,
                [f"{install}/sandbox-tools", "exec", REQUEST],
                {"SANDBOX_TOOLS_DIR": f"/tmp/st-{record.format.value}"},
                runs,
            )
            rows.append((f"{record.format.value}: exec version", samples))
            data = (dist / record.name).read_bytes()
            sizes.add_row(
                record.name,
                record.format.value,
                f"{len(data) / 1e6:.1f} MB",
                f"{len(gzip.compress(data, 9)) / 1e6:.1f} MB",
            )
        launch = mounted_source_runtime()
        rows.append(
            (
                "runtime from source (python3): exec version",
                await per_call_ms(
                    sandbox,
                    [*launch.command, "exec", REQUEST],
                    {**launch.env, "SANDBOX_TOOLS_DIR": "/tmp/st-source"},
                    runs,
                ),
            )
        )

    floor = statistics.median(rows[0][1])
    for name, samples in rows:
        ordered = sorted(samples)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        median = statistics.median(samples)
        timing.add_row(name, f"{median:.1f}", f"{p90:.1f}", f"{median / floor:.2f}")
    console = Console()
    console.print(timing)
    console.print(sizes)
    console.print(f"{runs} runs each after one warm-up call, through the docker SDK's exec.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--dist", type=Path, default=Path("dist"))
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.dist))
