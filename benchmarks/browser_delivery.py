"""The browser as a user meets it: first call cold and warm, per action, memory (a
benchmark, not a test).

In fresh containers (Debian 12 as root; a libc-free busybox as uid 1000 with a read-only
root and an exec tmpfs; both without network), through the host API the inspect tool
uses (`open_browser`: the add-on delivered on first use, then the runtime's JSON-RPC
over its channel), against a static site served inside the container, for each way the
add-on reaches a sandbox:

- `tar.xz`: the pinned archive, decompressed in the sandbox (what a remote engine or a
  service gets; forced here on the local engine);
- `tar`: the plain tar the host decompressed once (an engine on this host);
- `mount`: the checked tree mounted read-only when we make the container (docker_sdk,
  the MCP gateway); nothing is sent.

Rows: a bare `docker exec true` in the same container (the engine's floor); the runtime's
cold injection; the first browser call (the add-on's delivery, the session, the first
page); a later handle (a new sample in the same container): its runtime handle, then
the add-on's check (by the stat signature the first call recorded, where the add-on was
sent; nothing where it is mounted), a new session and the first page. Per action
(`--runs` times each, p50 and p99) and the browser's memory for the mount column only
(the browser is the same). The host's one-time work is timed on its own: the tree
digest `tools build` records, the plain copy, the unpacked tree.

Usage: .venv/bin/python benchmarks/browser_delivery.py [--runs N]
The runtime and the add-on come from the checkout's dist/ (built on demand).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.injector import addon_delivery
from sandbox_tools.injector.acquire import acquire_addon
from sandbox_tools.injector.addon_copy import (
    addon_tree,
    addons_on_host,
    docker_addon_mounts,
    plain_copy,
)
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.web_browser import BrowserSession, open_browser
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.runtime.addons import digest_of_archive
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import ContainerPolicy, RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox
from sandbox_tools.sandboxes.engines import docker_client
from sandbox_tools.sandboxes.images import RootfsStore, ensure_busybox_image, ensure_image

ARCH = Arch.parse(os.uname().machine)
PORT = 8000
SITE = {
    "index.html": "<!doctype html><title>Home</title><main><h1>Welcome</h1>"
    '<a href="next.html">Next page</a><form action="next.html"><label for="q">Search</label>'
    '<input id="q" name="q"><button>Go</button></form></main>',
    "next.html": "<!doctype html><title>Next</title><main><h1>Second page</h1></main>",
}
# The browser's processes (their command line names the add-on's directory) and their
# proportional set size, read as the sandbox's default user: the browser's own uid here
# (root cannot read another uid's smaps without CAP_SYS_PTRACE, which containers lack).
PSS = (
    "for d in /proc/[0-9]*; do "
    'case "$(tr "\\0" " " < "$d/cmdline" 2>/dev/null)" in */browser/*|*/browser-*) '
    'grep ^Pss: "$d/smaps_rollup" 2>/dev/null;; esac; done | '
    "awk '{s+=$2} END {print s+0}'"
)


async def _site(sandbox: Sandbox, root: str, server: list[str]) -> str:
    """The site written into the container and `server` started (it must return at once)."""
    for name, text in SITE.items():
        script = 'mkdir -p "$1" && cat > "$1/$2"'
        await sandbox.exec(["sh", "-c", script, "s", root, name], input=text)
    await sandbox.exec(server)
    return f"http://127.0.0.1:{PORT}"


def _element(tree: str, role: str, name: str) -> int:
    line = next(x.strip() for x in tree.splitlines() if f'{role} "{name}"' in x)
    return int(line[1 : line.index("]")])


async def _first_page(browser: BrowserSession, url: str) -> None:
    for _ in range(200):
        if (await browser.go(url)).error is None:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


async def _timed(runs: int, step: Callable[[], Awaitable[Any]]) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await step()
        times.append((time.perf_counter() - started) * 1000)
    return times


class FarEngine(DockerSandbox):
    """The local container driven as a remote engine's: the add-on goes as tar.xz."""

    @property
    def bytes_are_cheap(self) -> bool:
        return False


async def _bare_exec(sandbox: Sandbox) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        await sandbox.exec(["true"])
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(
    sandbox: Sandbox, server: list[str], root: str, runs: int, options: InjectionOptions
) -> dict[str, Any]:
    results: dict[str, Any] = {"bare `docker exec true`": await _bare_exec(sandbox)}
    started = time.perf_counter()
    support = await tool_support_sandbox(sandbox, options=options)
    results["runtime: cold injection"] = (time.perf_counter() - started) * 1000
    base = await _site(sandbox, root, server)
    started = time.perf_counter()
    install = await addon_delivery.ensure_browser(support)
    installed = time.perf_counter()
    browser = await open_browser(support)  # the add-on is there: the browser starts
    opened = time.perf_counter()
    await _first_page(browser, f"{base}/index.html")
    first_page = time.perf_counter()
    results["first call: the add-on's delivery"] = (installed - started) * 1000
    results["first call: new session (the browser starts)"] = (opened - installed) * 1000
    results["first call: first page"] = (first_page - opened) * 1000
    results["**first browser call in all**"] = (first_page - started) * 1000
    results["bytes sent into the sandbox (MB)"] = install.sent_bytes / 1e6

    home = f"{base}/index.html"

    async def click() -> None:
        page = await browser.go(home)
        await browser.click(_element(page.tree, "link", "Next page"))

    async def submit() -> None:
        page = await browser.go(home)
        await browser.type(_element(page.tree, "textbox", "Search"), "tea", submit=True)

    if runs:
        results["web_go"] = await _timed(runs, lambda: browser.go(home))
        results["web_go + web_click (navigates)"] = await _timed(runs, click)
        results["web_go + web_type_submit (navigates)"] = await _timed(runs, submit)
        results["the tree alone (web_scroll)"] = await _timed(runs, lambda: browser.scroll("down"))
        pss = await sandbox.exec(["sh", "-c", PSS])
        results["browser PSS MiB"] = int(pss.stdout.decode().strip() or 0) / 1024
    await browser.close()
    await forget_sandbox(sandbox)

    started = time.perf_counter()
    again = await tool_support_sandbox(sandbox, options=options)
    injected = time.perf_counter()
    await addon_delivery.ensure_browser(again)  # open_browser then finds it on the handle
    checked = time.perf_counter()
    browser = await open_browser(again)
    await _first_page(browser, home)
    done = time.perf_counter()
    results["later handle: runtime handle (reused install)"] = (injected - started) * 1000
    results["later handle: the add-on's check"] = (checked - injected) * 1000
    results["later handle: new session, first page"] = (done - checked) * 1000
    results["**later handle in all**"] = (done - started) * 1000
    await browser.close()
    await forget_sandbox(sandbox)
    return results


def _p(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(runs: int) -> dict[str, dict[str, Any]]:
    client = docker_client(4)
    roots, policy = RootfsStore.from_cascade(), ContainerPolicy.from_cascade()
    debian = ensure_image(
        client, RootfsRecipe(suite="bookworm", arch=ARCH, include=("python3",)), store=roots
    )
    busybox = ensure_busybox_image(client, ARCH, store=roots)
    with tempfile.TemporaryDirectory(prefix="browser-delivery-") as scratch:
        options = InjectionOptions(addons_on_host=Path(scratch))
        started = time.perf_counter()
        addon = await asyncio.to_thread(acquire_addon, ArtifactKind.BROWSER, ARCH)
        acquired = time.perf_counter()
        with addon.located.open("rb") as handle:  # what tools build does once, for the record
            digest_of_archive(handle)
        digested = time.perf_counter()
        copies, trees = addons_on_host(options)
        await asyncio.to_thread(plain_copy, addon, copies)
        copied = time.perf_counter()
        await asyncio.to_thread(addon_tree, addon, copies, trees)
        unpacked = time.perf_counter()
        out: dict[str, dict[str, Any]] = {
            "host, once": {
                "acquire the add-on (dist/, verified)": (acquired - started) * 1000,
                "tree digest of the archive (tools build, once per build)": (digested - acquired)
                * 1000,
                "plain copy (once per archive, for engines on this host)": (copied - digested)
                * 1000,
                "unpacked tree (once per tree, for the containers we make)": (unpacked - copied)
                * 1000,
            }
        }
        python_site = [
            "sh",
            "-c",
            f"cd /srv/site && nohup python3 -m http.server {PORT} --bind 127.0.0.1 "
            ">/dev/null 2>&1 &",
        ]
        busybox_site = ["busybox", "httpd", "-p", f"127.0.0.1:{PORT}", "-h", "/tmp/site"]
        locked: dict[str, Any] = {
            "read_only": True,
            "tmpfs": {"/tmp": "exec,size=1g"},
            "user": "1000:1000",
            "environment": {"HOME": "/tmp"},
        }
        plain: dict[str, Any] = {}
        for label, image, server, root, extra in (
            ("Debian 12, root", debian, python_site, "/srv/site", plain),
            ("busybox, uid 1000, read-only", busybox, busybox_site, "/tmp/site", locked),
        ):
            for transfer in ("tar.xz", "tar", "mount"):
                mounts = docker_addon_mounts(client, image, options) if transfer == "mount" else []
                with RunningContainer(
                    client, image, network_mode="none", policy=policy, mounts=mounts, **extra
                ) as container:
                    sandbox: Sandbox = container.sandbox
                    if transfer == "tar.xz":
                        sandbox = FarEngine(container.container, client)
                    out[f"{label}: {transfer}"] = await measure(
                        sandbox, server, root, runs if transfer == "mount" else 0, options
                    )
    return out


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return f"{statistics.median(value):.0f} / {_p(value, 0.99):.0f}"
    return "" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    results = asyncio.run(run(args.runs))
    console = Console(width=200)
    host = results.pop("host, once")
    table = Table(title="host, once (ms)")
    table.add_column("what")
    table.add_column("ms")
    for label, value in host.items():
        table.add_row(label, _cell(value))
    console.print(table)
    table = Table(title="per sandbox (ms; per action: p50 / p99)")
    table.add_column("what")
    for where in results:
        table.add_column(where)
    rows = list(dict.fromkeys(label for numbers in results.values() for label in numbers))
    for label in rows:
        table.add_row(label, *(_cell(numbers.get(label)) for numbers in results.values()))
    console.print(table)


if __name__ == "__main__":
    main()
