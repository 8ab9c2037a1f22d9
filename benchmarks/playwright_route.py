"""The route inspect's legacy web browser takes, measured here for comparison (a
benchmark, not a test): Playwright's driver (Node) driving a Chromium.

inspect_ai's legacy in-container browser is Playwright plus its own Chromium in the
`aisiuk/inspect-tool-support` image; that image cannot be pulled here (no registry) and
Playwright's Chromium download needs its CDN. So this drives Debian's
`chromium-headless-shell` (the same browser our add-on carries) with Playwright from
PyPI, on this host, against a loopback site: the driver's start, the browser's launch,
and the per-action times of the calls our tool makes (goto, click a link, fill and press
Enter, the accessibility snapshot), p50 and p99 over `--runs`.

Needs Playwright, which sandbox-tools does not depend on:
    python3 -m venv /tmp/pw && /tmp/pw/bin/pip install playwright
    /tmp/pw/bin/python benchmarks/playwright_route.py [--runs N]
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from playwright.sync_api import sync_playwright  # type: ignore[import-not-found]

BROWSER = "/usr/lib/chromium/chromium-headless-shell"
HOME = (
    "<!doctype html><title>Home</title><main><h1>Welcome</h1>"
    '<a href="/next">Next page</a><form action="/next"><label for="q">Search</label>'
    '<input id="q" name="q"><button>Go</button></form></main>'
)
NEXT = "<!doctype html><title>Next</title><main><h1>Second page</h1></main>"


class _Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        data = (HOME if self.path == "/" else NEXT).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _timed(runs: int, step: Callable[[], Any]) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    started = time.perf_counter()
    playwright = sync_playwright().start()
    driver = time.perf_counter()
    browser = playwright.chromium.launch(executable_path=BROWSER, headless=True)
    launched = time.perf_counter()
    page = browser.new_context().new_page()
    page.goto(base + "/")
    first = time.perf_counter()
    print(f"driver start: {(driver - started) * 1000:.0f} ms")
    print(f"browser launch: {(launched - driver) * 1000:.0f} ms")
    print(f"new context, page and first goto: {(first - launched) * 1000:.0f} ms")

    def click() -> None:
        page.goto(base + "/")
        page.click("text=Next page")
        page.wait_for_load_state("domcontentloaded")

    def submit() -> None:
        page.goto(base + "/")
        page.fill("#q", "tea")
        page.press("#q", "Enter")
        page.wait_for_load_state("domcontentloaded")

    rows = {
        "goto": _timed(args.runs, lambda: page.goto(base + "/")),
        "goto + click (navigates)": _timed(args.runs, click),
        "goto + fill + Enter (navigates)": _timed(args.runs, submit),
        # The accessibility tree as Playwright gives it now (page.accessibility is gone).
        "accessibility snapshot": _timed(args.runs, lambda: page.locator("body").aria_snapshot()),
    }
    for label, times in rows.items():
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"{label}: p50 {statistics.median(times):.0f} ms, p99 {p99:.0f} ms")
    browser.close()
    playwright.stop()
    server.shutdown()


if __name__ == "__main__":
    main()
