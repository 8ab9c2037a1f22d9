"""The desktop as a user meets it: the first `computer` call, each action, a screenshot,
memory, beside a bare `docker exec` (a benchmark, not a test).

In fresh containers without network (Debian 12; a libc-free busybox with a read-only
root and an exec tmpfs), the runtime injected as root and the desktop run as uid 1000,
through the host API `computer()` uses: the desktop add-on delivered on first use, then
the runtime's `computer_action` over its channel. The screen's settle time before an
action's screenshot (SANDBOX_TOOLS_DESKTOP_SETTLE, 2 s by default, as inspect's) is set
to 0 here, so each row is the action's own cost; a model waits 2 s more per action that
answers with a screenshot.

Rows: a bare `docker exec true` (the engine's floor); the runtime's cold injection; the
add-on's delivery (26 MB plain tar from the host's copy, unpacked and checked in the
sandbox); the first action (X server, window manager and terminal started, then a
screenshot); each action `--runs` times (p50 and p99); the desktop's memory (PSS of
the X server, window manager and terminal).

Usage: .venv/bin/python benchmarks/desktop.py [--runs N]
The runtime and the add-on come from the checkout's dist/ (built on demand).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.injector.addon_delivery import ensure_addon
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.platforms import Arch
from sandbox_tools.protocol import DESKTOP_SETTLE_ENV
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import ensure_busybox_image, ensure_image

ARCH = Arch.parse(os.uname().machine)
USER = "1000:1000"
# The desktop's processes (their command line names the add-on's bin/) and their PSS in
# KiB, read as the desktop's own uid (root cannot read another uid's smaps without
# CAP_SYS_PTRACE, which containers lack).
PSS = (
    "for d in /proc/[0-9]*; do "
    'case "$(tr "\\0" " " < "$d/cmdline" 2>/dev/null)" in */bin/Xvfb*|*/bin/twm*|*/bin/xterm*) '
    'grep ^Pss: "$d/smaps_rollup" 2>/dev/null;; esac; done | '
    "awk '{s+=$2} END {print s+0}'"
)
ACTIONS: dict[str, dict[str, Any]] = {
    "left_click": {"action": "left_click", "coordinate": [300, 300]},
    "mouse_move": {"action": "mouse_move", "coordinate": [400, 200]},
    "type (20 characters)": {"action": "type", "text": "echo sandbox tools 1"},
    "key (Return)": {"action": "key", "text": "Return"},
    "cursor_position": {"action": "cursor_position"},
    "screenshot (1366 x 768 PNG)": {"action": "screenshot"},
    "zoom (683 x 384)": {"action": "zoom", "region": [0, 0, 683, 384]},
}


async def _timed(step: Callable[[], Awaitable[Any]]) -> float:
    started = time.monotonic()
    await step()
    return (time.monotonic() - started) * 1000


def _quantiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.0f} / {p99:.0f} ms"


async def _column(client: Any, image: str, runs: int, **options: Any) -> dict[str, str]:
    column: dict[str, str] = {}
    with RunningContainer(
        client,
        image,
        platform=ARCH.platform,
        network_mode="none",
        environment={DESKTOP_SETTLE_ENV: "0"},
        **options,
    ) as container:
        sandbox = container.sandbox
        bare = [await _timed(lambda: sandbox.exec(["true"])) for _ in range(runs)]
        column["bare docker exec true"] = _quantiles(bare)
        started = time.monotonic()
        support = await tool_support_sandbox(sandbox)
        column["runtime cold injection"] = f"{(time.monotonic() - started) * 1000:.0f} ms"
        started = time.monotonic()
        install = await ensure_addon(support, ArtifactKind.DESKTOP)
        column["add-on delivered (first call)"] = (
            f"{(time.monotonic() - started) * 1000:.0f} ms ({install.sent_bytes / 1e6:.0f} MB)"
        )

        async def act(params: dict[str, Any]) -> Any:
            answer = await support.client.call("computer_action", {**params, "user": USER})
            assert not answer.get("error"), answer
            return answer

        column["first action (desktop started, screenshot)"] = (
            f"{await _timed(lambda: act({'action': 'screenshot'})):.0f} ms"
        )
        for name, params in ACTIONS.items():
            column[name] = _quantiles(
                [await _timed(lambda p=params: act(p)) for _ in range(runs)]  # type: ignore[misc]
            )
        pss = await sandbox.exec(["sh", "-c", PSS], user=USER)
        column["memory (PSS: X server, window manager, terminal)"] = (
            f"{int(pss.stdout.decode().strip() or 0) / 1024:.0f} MiB"
        )
        await forget_sandbox(sandbox)
    return column


async def main(runs: int) -> None:
    client = docker_client()
    debian = ensure_image(client, RootfsRecipe(suite="bookworm", arch=ARCH))
    busybox = ensure_busybox_image(client, ARCH)
    columns = {
        "Debian 12": await _column(client, debian, runs),
        "busybox, read-only": await _column(
            client, busybox, runs, read_only=True, tmpfs={"/tmp": "exec"}
        ),
    }
    table = Table(
        title=f"the desktop, {runs} runs per action ({os.cpu_count()} CPUs, {ARCH.value})"
    )
    table.add_column("")
    for name in columns:
        table.add_column(name, justify="right")
    for row in next(iter(columns.values())):
        table.add_row(row, *(column[row] for column in columns.values()))
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
