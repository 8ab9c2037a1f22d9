"""The web browser tool's cost on this machine (a benchmark, not a test).

Against a loopback site served by Python's http.server, through the tool's controller
(the runtime's own code, without the socket in between): the median and 90th percentile
of `web_go`, `web_click` on a link, `web_type_submit` of a form and `web_scroll` (which
is the accessibility tree read and rendered, and nothing else), for a small page and a
long one; and the browser's memory (the proportional set size of its whole process group,
so shared pages are counted once) with one and with four sessions open.
Usage: .venv/bin/python benchmarks/web_browser_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import os
import re
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    ClickParams,
    GoParams,
    NewSessionParams,
    ScrollParams,
    TypeParams,
)

SMALL = """<!doctype html><title>Home</title><main><h1>Welcome</h1><p>Start here.</p>
<a href="/next">Next page</a><form action="/search"><label for="q">Search</label>
<input id="q" name="q"><button>Go</button></form></main>"""
LONG = (
    "<!doctype html><title>Long</title><main>"
    + "".join(
        f"<p>Paragraph {i} with <a href='/next'>a link {i}</a> and some text.</p>"
        for i in range(2000)
    )
    + "</main>"
)
NEXT = "<!doctype html><title>Next</title><main><h1>Second page</h1></main>"


class _Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        body = {"/": SMALL, "/long": LONG, "/next": NEXT, "/search": NEXT}.get(path, NEXT)
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def group_pss_mib(pgid: int) -> float:
    """Proportional set size of every process in a group, MiB."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if int(handle.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                total += sum(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
        except (OSError, ValueError):
            continue
    return total / 1024


def element(tree: str, role: str, name: str) -> int:
    match = re.search(rf'\[(\d+)\] {role} "{re.escape(name)}"', tree)
    assert match, f"no {role} {name!r}"
    return int(match.group(1))


async def timed(runs: int, step: Callable[[], Awaitable[Any]]) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await step()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def measure(base: str, runs: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    controller = WebBrowserController(Limits())
    results: dict[str, list[float]] = {}
    memory: dict[str, float] = {}
    try:
        started = time.perf_counter()
        name = (await controller.new_session(NewSessionParams.parse({})))["session_name"]
        results["first web_new_session (starts the browser)"] = [
            (time.perf_counter() - started) * 1000
        ]

        def go(url: str) -> Callable[[], Awaitable[Any]]:
            return lambda: controller.go(GoParams.parse({"session_name": name, "url": url}))

        results["web_go, small page"] = await timed(runs, go(f"{base}/"))
        results["web_go, long page (2000 paragraphs)"] = await timed(runs, go(f"{base}/long"))

        async def click() -> None:
            tree = (await go(f"{base}/")())["web_at"]
            link = element(tree, "link", "Next page")
            started = time.perf_counter()
            await controller.click(ClickParams.parse({"session_name": name, "element_id": link}))
            click_times.append((time.perf_counter() - started) * 1000)

        async def submit() -> None:
            tree = (await go(f"{base}/")())["web_at"]
            field = element(tree, "textbox", "Search")
            params = {"session_name": name, "element_id": field, "text": "cats"}
            started = time.perf_counter()
            await controller.type_text(TypeParams.parse(params), submit=True)
            submit_times.append((time.perf_counter() - started) * 1000)

        click_times: list[float] = []
        submit_times: list[float] = []
        await timed(runs, click)
        await timed(runs, submit)
        results["web_click on a link (navigates)"] = click_times
        results["web_type_submit of a form (navigates)"] = submit_times
        for page in ("/", "/long"):
            await go(f"{base}{page}")()
            scroll = ScrollParams.parse({"session_name": name, "direction": "down"})
            label = "small page" if page == "/" else "long page"
            results[f"the tree alone (web_scroll), {label}"] = await timed(
                runs, lambda scroll=scroll: controller.scroll(scroll)
            )
        pid = (await controller.info())["pid"]
        assert isinstance(pid, int)
        memory["one session, long page shown"] = group_pss_mib(pid)
        for _ in range(3):
            other = (await controller.new_session(NewSessionParams.parse({})))["session_name"]
            await controller.go(GoParams.parse({"session_name": other, "url": f"{base}/long"}))
        memory["four sessions, long page in each"] = group_pss_mib(pid)
    finally:
        await controller.shutdown()
    return results, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        results, memory = asyncio.run(measure(f"http://127.0.0.1:{server.server_port}", args.runs))
    finally:
        server.shutdown()
    table = Table(title=f"web browser, {args.runs} runs each (ms)")
    for column in ("call", "p50", "p90", "runs"):
        table.add_column(column)
    for label, times in results.items():
        ordered = sorted(times)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        table.add_row(label, f"{statistics.median(times):.1f}", f"{p90:.1f}", str(len(times)))
    console = Console()
    console.print(table)
    for label, mib in memory.items():
        console.print(f"browser memory (PSS of its process group), {label}: {mib:.0f} MiB")


if __name__ == "__main__":
    main()
