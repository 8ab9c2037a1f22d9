"""Where a cold injection's time goes, step by step (a benchmark, not a test).

For each target (Debian 12, a libc-free busybox image, Debian with a read-only root and
an exec tmpfs), N fresh containers:
1. a bare `docker exec true` in the fresh container (the floor every step above pays),
   then a real injection through the persistent channel, its steps recorded by the
   injector: the install tags (host), the probe, which makes the install directory and
   is the first start's own stream, the host's go with the runtime's bytes on that
   stream (received, checked and moved into place there), and the first answer (unpack,
   server start); a step the injection did not take shows "-";
2. in another fresh container, the runtime's own start phases, each timed by a bare
   `docker exec` of the artifact: unpack, the bundled loader and Python starting
   (`--version`), the server starting (`start-server`), the first answer through the
   static launcher (`exec`), and a warm `exec` for comparison; `true` is the exec floor.

Usage: .venv/bin/python benchmarks/cold_start_steps.py [--runs N] [--dist DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.injector.inject import forget_sandbox, recording_steps, tool_support_sandbox
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_busybox_image, ensure_image

EXE = "/tmp/st/sandbox-tools"
VERSION = '{"jsonrpc":"2.0","id":1,"method":"version"}'


def targets(client: Any, arch: Arch) -> dict[str, tuple[str, dict[str, Any]]]:
    debian = ensure_image(client, RootfsRecipe(suite="bookworm", arch=arch))
    busybox = ensure_busybox_image(client, arch)
    read_only = {"read_only": True, "tmpfs": {"/tmp": "exec,mode=1777"}}
    return {
        "debian-12": (debian, {}),
        "busybox (no libc)": (busybox, {}),
        "debian-12, read-only root": (debian, read_only),
    }


async def injection_steps(client: Any, image: str, options: dict[str, Any]) -> dict[str, float]:
    with RunningContainer(client, image, **options) as container:
        sandbox = container.sandbox
        started = time.perf_counter()
        await sandbox.exec(["true"])
        floor = time.perf_counter() - started
        started = time.perf_counter()
        with recording_steps() as steps:
            support = await tool_support_sandbox(sandbox)
        steps["= injection, total"] = time.perf_counter() - started
        await support.aclose()
        await forget_sandbox(sandbox)
    return {"bare `docker exec true`": floor, **steps}


async def runtime_phases(
    client: Any, image: str, options: dict[str, Any], artifact: Path
) -> dict[str, float]:
    with RunningContainer(client, image, **options) as container:
        sandbox = container.sandbox
        # Through exec, not the engine's archive API: that refuses a read-only root's tmpfs.
        write = f"mkdir -p /tmp/st && cat > {EXE} && chmod 755 {EXE}"
        await sandbox.exec(["sh", "-c", write], input=artifact.read_bytes())
        env = {"SANDBOX_TOOLS_DIR": "/tmp/st/run"}
        phases: dict[str, float] = {}
        for name, argv in [
            ("docker exec true (the floor)", ["true"]),
            ("unpack", [EXE, "unpack"]),
            ("loader + Python start (--version)", [EXE, "--version"]),
            ("server start (start-server)", [EXE, "start-server"]),
            ("first answer via the launcher (exec)", [EXE, "exec", VERSION]),
            ("warm answer via the launcher (exec)", [EXE, "exec", VERSION]),
        ]:
            started = time.perf_counter()
            done = await sandbox.exec(argv, env=env)
            phases[name] = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"{argv} failed in {image}: {done.stderr.decode()}")
    return phases


async def measure(runs: int, artifact: Path) -> dict[str, dict[str, list[float]]]:
    client = docker_client()
    arch = Arch.parse(os.uname().machine)
    results: dict[str, dict[str, list[float]]] = {}
    for label, (image, options) in targets(client, arch).items():
        collected: dict[str, list[float]] = {}
        for _ in range(runs):
            for step, seconds in (await injection_steps(client, image, options)).items():
                collected.setdefault(step, []).append(seconds)
            phases = await runtime_phases(client, image, options, artifact)
            for step, seconds in phases.items():
                collected.setdefault(f"runtime: {step}", []).append(seconds)
        results[label] = collected
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    default_dist = os.environ.get("SANDBOX_TOOLS_DIST", "dist")
    parser.add_argument("--dist", type=Path, default=Path(default_dist))
    args = parser.parse_args()
    os.environ["SANDBOX_TOOLS_DIST"] = str(args.dist.resolve())
    arch = Arch.parse(os.uname().machine)
    artifacts = sorted(args.dist.glob(f"sandbox-tools-*-linux-{arch.value}"))
    if not artifacts:
        raise SystemExit(f"no artifact for {arch.value} in {args.dist}; run `tools build` first")
    results = asyncio.run(measure(args.runs, artifacts[-1]))
    labels = list(results)
    steps = list(dict.fromkeys(step for r in results.values() for step in r))
    table = Table(title=f"cold injection, ms per step (median of {args.runs})")
    table.add_column("step")
    for label in labels:
        table.add_column(label, justify="right")
    for step in steps:
        row = [step]
        for label in labels:
            values = results[label].get(step)
            row.append(f"{statistics.median(values) * 1000:.0f}" if values else "-")
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
