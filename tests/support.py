"""The one module of helpers and fakes the test folders share, imported by name (plain
functions and classes; fixtures stay in the conftests, which import from here): running
the real `inspect eval` and `tools --help` as a user would, a private runtime server
directory, waiting for a side effect, the architectures and target images under test,
and a scripted sandbox that answers the injector as a fresh Debian container would."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.injector.recon import CHECK_SCRIPT, PROBE_SCRIPT
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    CrawlerResult,
    GoParams,
    NewSessionParams,
)
from sandbox_tools.sandboxes.base import DEFAULT_EXEC_TIMEOUT, ExecOutput, Sandbox


def inspect_eval(
    directory: Path,
    task_file: str,
    *options: str,
    env: dict[str, str],
    json_log: bool = True,
    timeout: float = 1200,
) -> subprocess.CompletedProcess[str]:
    """`inspect eval TASK_FILE OPTIONS` in a child process, from the task's directory
    (inspect globs task paths relative to it), logs under `logs/` (JSON, so tests read
    them without inspect; `json_log=False`: inspect's default), plain display."""
    log_format = ["--log-format", "json"] if json_log else []
    return subprocess.run(
        [sys.executable, "-m", "inspect_ai", "eval", task_file, *options, *log_format,
         "--display", "plain"],
        capture_output=True,
        text=True,
        cwd=directory,
        env={**os.environ, "INSPECT_LOG_DIR": str(directory / "logs"), **env},
        timeout=timeout,
    )  # fmt: skip


def eval_samples(directory: Path, done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The samples of a successful eval's JSON log."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = (directory / "logs").glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    return list(log["samples"])


def cli_help(*command: str) -> subprocess.CompletedProcess[str]:
    """`tools COMMAND --help`, wide enough that no line wraps."""
    return subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", *command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
        timeout=60,
    )


SRC = str(Path(__file__).resolve().parent.parent / "src")


def peak_rss_mib(pid: int | str = "self") -> float:
    """Peak resident memory (VmHWM) of a process, MiB: what bounds on memory are checked by."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def reset_peak_rss() -> None:
    """Start this process's VmHWM again from its current RSS (Linux: clear_refs 5), so a
    test's peak is its own, not that of a test before it."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def rss_mib(pid: int | str = "self") -> float:
    """Resident memory (VmRSS) of a process now, MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class RuntimeDir:
    """A private server directory and helpers to drive the runtime CLI from source."""

    path: str

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SANDBOX_TOOLS_DIR": self.path,
            "PYTHONPATH": SRC,
            "SANDBOX_TOOLS_KILL_GRACE": "0.5",
        }

    def cli(
        self, *args: str, input: str | None = None, timeout: float = 60, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_tools.runtime", *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=cwd,
        )

    def call(
        self, method: str, params: dict[str, Any] | None = None, cwd: str | None = None
    ) -> dict[str, Any]:
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        done = self.cli("exec", json.dumps(request), cwd=cwd)
        assert done.returncode == 0, done.stderr
        response: dict[str, Any] = json.loads(done.stdout)
        return response

    def result(
        self, method: str, params: dict[str, Any] | None = None, cwd: str | None = None
    ) -> Any:
        response = self.call(method, params, cwd)
        assert "result" in response, response
        return response["result"]

    def server_pid(self) -> int | None:
        try:
            return int(Path(self.path, "server.pid").read_text())
        except (OSError, ValueError):
            return None

    def server_starts(self) -> int:
        log = Path(self.path, "server.log")
        return log.read_text().count("server started") if log.exists() else 0


def eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Wait until `check()` holds, polling; fail naming `what` after `timeout` seconds.

    Tests wait for conditions, never for a fixed time: a fixed sleep is too short on a
    loaded machine and wasted on an idle one.
    """
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)


# The user with a home directory in the image of inspect's own checks (self_check_image).
NONROOT = "nonroot"

# Offline-buildable targets: Debian releases from debootstrap, and a libc-free busybox.
DEBIAN_SUITES = {"debian-11": "bullseye", "debian-12": "bookworm", "debian-13": "trixie"}


def ensure_target_image(client: Any, target: str, arch: Arch) -> str:
    from sandbox_tools.recipes import RootfsRecipe
    from sandbox_tools.sandboxes.images import ensure_busybox_image, ensure_image

    if target == "busybox":
        return ensure_busybox_image(client, arch)
    return ensure_image(client, RootfsRecipe(suite=DEBIAN_SUITES[target], arch=arch))


def arches_under_test() -> list[Arch]:
    """The host's architecture; arm64 too with SANDBOX_TOOLS_TEST_ARM64=1 (QEMU, slow)."""
    arches = [Arch.parse(os.uname().machine)]
    if os.environ.get("SANDBOX_TOOLS_TEST_ARM64") == "1" and Arch.ARM64 not in arches:
        arches.append(Arch.ARM64)
    return arches


MCP_SITE_MOUNT = "/opt/mcp-site"


MCP_SERVERS_MOUNT = "/opt/mcp-servers"


def run_inspect_eval(
    task_file: Path, *options: str, env: dict[str, str], timeout: float = 900
) -> tuple[dict[str, Any], Path]:
    """A real `inspect eval` of `task_file` (see `inspect_eval`). Returns the one sample,
    asserted to have run without error, and its log file."""
    done = inspect_eval(task_file.parent, task_file.name, *options, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = (task_file.parent / "logs").glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    (sample,) = log["samples"]
    assert sample.get("error") is None, sample["error"]
    return sample, log_file


# Environments the runtime must refuse as invalid params, naming the key.
BAD_ENVS = [
    pytest.param({"A=B": "x"}, "'A=B'", id="equals-in-name"),
    pytest.param({"": "x"}, "''", id="empty-name"),
    pytest.param({"A\u0000B": "x"}, "NUL", id="nul-in-name"),
    # "input" is a stdin field elsewhere, where NUL is allowed: not in an environment.
    pytest.param({"input": "a\u0000b"}, "'input'", id="nul-in-value"),
]


def request(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


@contextlib.contextmanager
def serve_site(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A small web site on loopback for the browser tests; its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


async def new_browser_session(controller: WebBrowserController, **params: Any) -> str:
    return (await controller.new_session(NewSessionParams.parse(params)))["session_name"]


async def browse(controller: WebBrowserController, session: str, url: str) -> CrawlerResult:
    return await controller.go(GoParams.parse({"session_name": session, "url": url}))


def locked_down_busybox(client: Any, arch: Arch, tmp_size: str = "1g") -> Any:
    """The hardest sandbox the browser meets, as a RunningContainer to enter: a static
    busybox and nothing else (no libc), uid 1000, a read-only root with an exec tmpfs of
    `tmp_size` at /tmp (HOME), and no network."""
    from sandbox_tools.sandboxes.containers import RunningContainer
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    return RunningContainer(
        client,
        ensure_busybox_image(client, arch),
        platform=arch.platform,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": f"exec,size={tmp_size}"},
        user="1000:1000",
        environment={"HOME": "/tmp"},
    )


def site_handler(
    pages: dict[str, str], slow_seconds: float
) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler for `serve_site` serving `pages` by path: `/search?q` answers with what
    was searched, `/slow` waits `slow_seconds` and then shows `/next`; any other path is
    a 404."""

    class Site(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/slow":
                time.sleep(slow_seconds)
            if path == "/search":
                body = (
                    "<!doctype html><title>Results</title>"
                    f"<main><p>You searched: {query}</p></main>"
                )
            else:
                body = pages.get(path, pages["/next"] if path == "/slow" else "")
            if not body:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # The browser may be killed while the page is on its way.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Site


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range: a port from that
    range (what binding port 0 gives) may be taken as the source port of any outgoing
    connection before the test's server binds it, which busy tests make likely."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    ephemeral_low = int(ranges.split()[0])
    for _ in range(200):
        port = random.randrange(10_000, ephemeral_low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port below the ephemeral range")


# -- reading an inspect eval's messages, as inspect's own test helpers do ----------------


def get_tool_call(messages: list[Any], tool: str) -> Any:
    """The first call of `tool` an assistant message made (an inspect ToolCall), or None."""
    calls = [
        call
        for message in messages
        if getattr(message, "role", None) == "assistant"
        for call in getattr(message, "tool_calls", None) or []
        if call.function == tool
    ]
    return calls[0] if calls else None


def get_tool_response(messages: list[Any], tool_call: Any) -> Any:
    """The tool message answering `tool_call` (an inspect ChatMessageTool), or None."""
    return next(
        (
            message
            for message in messages
            if getattr(message, "role", None) == "tool" and message.tool_call_id == tool_call.id
        ),
        None,
    )


# What the injector's probe prints in a fresh Debian 12 container, as root.
GOOD = b"""os_id=debian
os_version=12
arch=x86_64
libc=glibc
uid=0
user=root
sha256sum=yes
home=/root
cand.0=ok|0|755|yes
cand.1=ok|0|1777|no
cand.2=ok|0|1777|no
cand.3=noexec|0|1777|no
cand.4=ok|0|700|no
"""


BUILD_ID = "sha256:" + "ab" * 32


class ScriptedDebian(Sandbox):
    """Answers the injector's fixed commands as a fresh Debian container would."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.files: dict[str, bytes] = {}

    async def exec(
        self,
        cmd: list[str],
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = 1 << 26,
    ) -> ExecOutput:
        if cmd[:3] == ["sh", "-c", PROBE_SCRIPT]:
            return ExecOutput(0, GOOD.replace(b"|0|755|yes", b"|0|755|no"), b"")
        if cmd[:3] == ["sh", "-c", CHECK_SCRIPT]:
            raise AssertionError("nothing was installed before: no check expected")
        if cmd[-2] == "mkdir":
            return ExecOutput(0, cmd[-1].encode() + b"\n", b"")
        if cmd[-1] == "exec":  # the runtime: answer runtime_info
            request = json.loads(input or "{}")
            result = {
                "version": "0",
                "build_id": BUILD_ID,
                "format": "portable",
                "platform": "linux/amd64",
                "pid": 1,
                "server_dir": "/run",
            }
            response = {"jsonrpc": "2.0", "id": request["id"], "result": result}
            return ExecOutput(0, json.dumps(response).encode() + b"\n", b"")
        if cmd[-4] == "finish":  # verify and move
            return ExecOutput(0, b"", b"")
        raise AssertionError(f"unexpected command {cmd[:3]}")

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.files[path] = data

    async def read_file(self, path: str) -> bytes:
        return self.files[path]
