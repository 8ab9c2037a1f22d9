"""The browser as a user meets it: first call cold and warm, per action, memory (a
benchmark, not a test).

In fresh containers (Debian 12 as root; a libc-free busybox as uid 1000 with a read-only
root and an exec tmpfs; both without network), through the host API the inspect tool
uses (`open_browser`: the add-on installed on first use, then the runtime's JSON-RPC
over its channel), against a static site served inside the container:

- cold: the first browser call of a fresh container, split into the add-on's install
  (the host's tree digest of the archive, once per host process; the in-sandbox check;
  sending, unpacking and checking the 100 MB archive) and the browser's start with the
  first page;
- warm: a later handle (a new sample in the same container): the in-place check of the
  installed tree, a new session and its first page;
- per action, `--runs` times each: web_go, web_click on a link, web_type_submit of a
  form, the tree alone (web_scroll), through the whole stack; p50 and p99;
- the browser's memory: the proportional set size of its process group in the container.

Usage: .venv/bin/python benchmarks/browser_delivery.py [--runs N]
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

from sandbox_tools.injector import browser_addon
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.injector.web_browser import BrowserSession, open_browser
from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.runtime.addons import digest_of_archive
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import ContainerPolicy, RunningContainer
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


async def measure(
    container: RunningContainer, server: list[str], root: str, runs: int
) -> dict[str, Any]:
    sandbox = container.sandbox
    support = await tool_support_sandbox(sandbox)
    base = await _site(sandbox, root, server)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    install = await browser_addon.ensure_browser(support)
    installed = time.perf_counter()
    browser = await open_browser(support)  # the add-on is there: the browser starts
    opened = time.perf_counter()
    await _first_page(browser, f"{base}/index.html")
    first_page = time.perf_counter()
    results["cold: add-on install (check, send, unpack, check)"] = (installed - started) * 1000
    results["cold: new session (starts the browser)"] = (opened - installed) * 1000
    results["cold: first page"] = (first_page - opened) * 1000
    results["cold: first call in all"] = (first_page - started) * 1000
    results["bytes sent"] = install.sent_bytes

    home = f"{base}/index.html"

    async def click() -> None:
        page = await browser.go(home)
        await browser.click(_element(page.tree, "link", "Next page"))

    async def submit() -> None:
        page = await browser.go(home)
        await browser.type(_element(page.tree, "textbox", "Search"), "tea", submit=True)

    results["web_go"] = await _timed(runs, lambda: browser.go(home))
    results["web_go + web_click (navigates)"] = await _timed(runs, click)
    results["web_go + web_type_submit (navigates)"] = await _timed(runs, submit)
    results["the tree alone (web_scroll)"] = await _timed(runs, lambda: browser.scroll("down"))
    pss = await sandbox.exec(["sh", "-c", PSS])
    results["browser PSS MiB"] = int(pss.stdout.decode().strip() or 0) / 1024
    await browser.close()
    await forget_sandbox(sandbox)

    started = time.perf_counter()
    again = await tool_support_sandbox(sandbox)
    injected = time.perf_counter()
    browser = await open_browser(again)
    await _first_page(browser, home)
    done = time.perf_counter()
    results["warm: runtime handle (reused install)"] = (injected - started) * 1000
    results["warm: add-on check, new session, first page"] = (done - injected) * 1000
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
    # The host's digest of the archive, once per process: measured on its own.
    started = time.perf_counter()
    from sandbox_tools.artifacts import ArtifactFormat
    from sandbox_tools.injector.acquire import acquire_artifact

    addon = await asyncio.to_thread(acquire_artifact, ARCH, ArtifactFormat.TAR_XZ)
    acquired = time.perf_counter()
    with addon.located.open("rb") as handle:  # what tools build does once, for the record
        digest_of_archive(handle)
    digested = time.perf_counter()
    out: dict[str, dict[str, Any]] = {
        "host": {
            "acquire the add-on (dist/, verified)": (acquired - started) * 1000,
            "tree digest of the archive (tools build, once; never at eval time)": (
                digested - acquired
            )
            * 1000,
        }
    }
    with RunningContainer(client, debian, network_mode="none", policy=policy) as container:
        out["Debian 12, root"] = await measure(
            container,
            [
                "sh",
                "-c",
                f"cd /srv/site && nohup python3 -m http.server {PORT} --bind 127.0.0.1 "
                ">/dev/null 2>&1 &",
            ],
            "/srv/site",
            runs,
        )
    with RunningContainer(
        client,
        busybox,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": "exec,size=1g"},
        user="1000:1000",
        environment={"HOME": "/tmp"},
        policy=policy,
    ) as container:
        out["busybox, uid 1000, read-only"] = await measure(
            container,
            ["busybox", "httpd", "-p", f"127.0.0.1:{PORT}", "-h", "/tmp/site"],
            "/tmp/site",
            runs,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    results = asyncio.run(run(args.runs))
    console = Console()
    for where, numbers in results.items():
        table = Table(title=where)
        for column in ("what", "ms / value", "p50 ms", "p99 ms"):
            table.add_column(column)
        for label, value in numbers.items():
            if isinstance(value, list):
                table.add_row(
                    label, "", f"{statistics.median(value):.0f}", f"{_p(value, 0.99):.0f}"
                )
            else:
                table.add_row(label, f"{value:.0f}", "", "")
        console.print(table)


if __name__ == "__main__":
    main()
