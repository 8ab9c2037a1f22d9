"""Cold injection and warm calls, side by side with a bare `docker exec true`.

Cold: a fresh container, then tool_support_sandbox with the default options (one
stream: the probe, which makes the install directory, then the host's go and the
runtime's bytes, which the same shell checks, moves into place and starts; the runtime
unpacks and starts the server) and one `version` call; each of its steps is printed
too, beside the bare exec measured in the same containers.
Warm: one `version` call per exec afterwards, and through the persistent channel.
Reuse: a new handle on the same container (the probe, which checks the earlier install
and has the launcher compare its unpacked tree with its payload, then on the same
stream the go that starts it, and the first answer).
Usage: .venv/bin/python benchmarks/injection.py [--runs N] [--image debian-12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from rich.console import Console
from rich.table import Table

from sandbox_tools.distro_matrix.docker_backend import DockerBackend
from sandbox_tools.distro_matrix.matrix import load_matrix
from sandbox_tools.injector.inject import (
    forget_sandbox,
    recording_steps,
    runtime_env,
    tool_support_sandbox,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import ContainerPolicy, RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import RootfsStore

VERSION = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "version"})


async def main(runs: int, target: str) -> None:
    client = docker_client()
    arch = Arch.parse(os.uname().machine)
    distro = next(d for d in load_matrix().distros if d.name == target)
    backend = DockerBackend(client, ContainerPolicy.from_cascade(), RootfsStore.from_cascade())
    image, _ = backend.resolve_image(distro, arch)
    assert image is not None
    cold, warm_exec, warm_stream, bare, reuse = [], [], [], [], []
    steps_of_cold: dict[str, list[float]] = {}
    steps_of_reuse: dict[str, list[float]] = {}
    for _ in range(runs):
        with RunningContainer(client, image) as container:
            sandbox = container.sandbox
            started = time.perf_counter()
            await sandbox.exec(["true"])
            bare.append(time.perf_counter() - started)
            started = time.perf_counter()
            with recording_steps() as cold_steps:
                support = await tool_support_sandbox(sandbox)
            await support.client.call("version")
            cold.append(time.perf_counter() - started)
            for step, seconds in cold_steps.items():
                steps_of_cold.setdefault(step, []).append(seconds)
            exe, env = support.exe, runtime_env(support.install_dir)
            for _ in range(5):
                started = time.perf_counter()
                await sandbox.exec([exe, "exec", VERSION], env=env)
                warm_exec.append(time.perf_counter() - started)
                started = time.perf_counter()
                await sandbox.exec(["true"])
                bare.append(time.perf_counter() - started)
            await support.aclose()
            await forget_sandbox(sandbox)
            started = time.perf_counter()
            with recording_steps() as steps:
                stream = await tool_support_sandbox(sandbox)  # reuses the install
            reuse.append(time.perf_counter() - started)
            assert stream.reused
            for step, seconds in steps.items():
                steps_of_reuse.setdefault(step, []).append(seconds)
            for _ in range(5):
                started = time.perf_counter()
                await stream.client.call("version")
                warm_stream.append(time.perf_counter() - started)
            await stream.aclose()
            await forget_sandbox(sandbox)
    table = Table(title=f"injection into a fresh {target} container ({arch.value}), ms")
    for column in ("what", "median", "max", "x bare exec"):
        table.add_column(column)
    floor = statistics.median(bare)
    cold_rows, reuse_rows = (
        [
            (f"{what}, of which: {step}", samples)
            for step, samples in steps.items()
            if max(samples) >= 0.0005  # steps an injection does not take
        ]
        for what, steps in (("cold", steps_of_cold), ("reuse", steps_of_reuse))
    )
    for name, samples in (
        ("bare `docker exec true`", bare),
        ("cold: probe + first call (receive, verify, unpack, server start)", cold),
        *cold_rows,
        ("warm: `exec version` per call", warm_exec),
        ("warm: `version` via persistent channel", warm_stream),
        ("reuse: probe (with the checks) + first answer", reuse),
        *reuse_rows,
    ):
        median = statistics.median(samples)
        table.add_row(
            name, f"{median * 1000:.1f}", f"{max(samples) * 1000:.1f}", f"{median / floor:.2f}"
        )
    Console().print(table)
    Console().print(f"{runs} fresh containers; 5 warm calls each.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default="debian-12")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.image))
