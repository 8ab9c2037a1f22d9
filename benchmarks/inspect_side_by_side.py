"""inspect_ai's runtime vs ours, per tool call, in one run (a benchmark, not a test).

Three real `inspect eval` runs (mockllm, no model calls), each in a fresh container of
the offline Debian bookworm image through the `docker_sdk` sandbox; a solver times:
the first call (which includes injecting the runtime), then `exec_remote` of
`sleep 0.2`, a bash_session `echo`, and a text_editor `view`:

- inspect: inspect's own host code and its shipped runtime (artifact v35);
- inspect+ours: inspect's own host code, our runtime in its place (dropin.py);
- ours: our inspect tools (`sandbox_tools.inspect`), our injection and runtime.

Usage: .venv/bin/python benchmarks/inspect_side_by_side.py [--runs N] [--dist DIR]
(DIR holds the built artifact, e.g. from `tools build`; default $SANDBOX_TOOLS_DIST or dist).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.inspect.dropin import (
    INSTALL_STATE_ENV,
    INSTALL_STATE_USING_DEV,
    as_inspect_dev_runtime,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_image

TASK = textwrap.dedent(
    """
    import os, time

    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, TaskState, solver
    from inspect_ai.util import sandbox

    OURS = os.environ["BENCH_MODE"] == "ours"
    RUNS = int(os.environ["BENCH_RUNS"])
    if OURS:
        from sandbox_tools.inspect import bash_session, exec_remote, text_editor
    else:
        from inspect_ai.tool import bash_session, text_editor

        async def exec_remote(cmd, stream):
            return await sandbox().exec_remote(cmd, stream=stream)


    async def timed(call):
        started = time.perf_counter()
        await call()
        return (time.perf_counter() - started) * 1000


    @solver
    def measure():
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            bash, edit = bash_session(), text_editor()
            await sandbox().exec(["sh", "-c", "seq 1 200 > /tmp/view.txt"])
            times = {"first": [await timed(lambda: bash(action="type_submit", input="true"))]}
            calls = {
                "exec_remote sleep 0.2": lambda: exec_remote(["sleep", "0.2"], stream=False),
                "bash_session echo": lambda: bash(action="type_submit", input="echo hi"),
                "text_editor view": lambda: edit(command="view", path="/tmp/view.txt"),
            }
            for name, call in calls.items():
                times[name] = [await timed(call) for _ in range(RUNS)]
            state.store.set("times", times)
            return state

        return solve


    @task
    def side_by_side():
        return Task(dataset=[Sample(input="measure")], solver=measure())
    """
)
MODES = ("inspect", "inspect+ours", "ours")


def run_mode(mode: str, image: str, dist: Path, runs: int, work: Path) -> dict[str, list[float]]:
    (work / "side_by_side.py").write_text(TASK)
    config = work / "sandbox.json"
    config.write_text(json.dumps({"image": image}))
    logs = work / f"logs-{mode}"
    env = {
        **os.environ,
        "BENCH_MODE": "ours" if mode == "ours" else "inspect",
        "BENCH_RUNS": str(runs),
        "SANDBOX_TOOLS_DIST": str(dist),
        "INSPECT_LOG_DIR": str(logs),
    }
    if mode == "inspect+ours":
        env[INSTALL_STATE_ENV] = INSTALL_STATE_USING_DEV
    else:
        env.pop(INSTALL_STATE_ENV, None)
    command = [sys.executable, "-m", "inspect_ai", "eval", "side_by_side.py"]
    command += ["--model", "mockllm/model", "--sandbox", f"docker_sdk:{config}"]
    command += ["--log-format", "json", "--display", "none"]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{mode}: inspect eval failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    (log_file,) = logs.glob("*.json")
    (sample,) = json.loads(log_file.read_text())["samples"]
    if sample.get("error"):
        raise SystemExit(f"{mode}: {sample['error']['message']}")
    times: dict[str, list[float]] = sample["store"]["times"]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    default_dist = os.environ.get("SANDBOX_TOOLS_DIST", "dist")
    parser.add_argument("--dist", type=Path, default=Path(default_dist))
    args = parser.parse_args()
    arch = Arch.parse(os.uname().machine)
    artifacts = sorted(args.dist.glob(f"sandbox-tools-*-linux-{arch.value}"))
    if not artifacts:
        raise SystemExit(f"no artifact for {arch.value} in {args.dist}; run `tools build` first")
    image = ensure_image(docker_client(), RootfsRecipe(suite="bookworm", arch=arch))
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, as_inspect_dev_runtime(artifacts[-1], arch):
        for mode in MODES:
            work = Path(tmp, mode.replace("+", "_"))
            work.mkdir()
            results[mode] = run_mode(mode, image, args.dist.resolve(), args.runs, work)
    table = Table(title=f"ms per tool call, median of {args.runs} (first call: one)")
    table.add_column("call")
    for mode in MODES:
        table.add_column(mode, justify="right")
    for call in results["inspect"]:
        row: list[Any] = [call]
        row += [f"{statistics.median(results[mode][call]):.0f}" for mode in MODES]
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
