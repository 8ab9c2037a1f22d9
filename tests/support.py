"""The one module of helpers and fakes the test folders share, imported by name (plain
functions and classes; fixtures stay in the conftests, which import from here): running
the real `inspect eval` and `tools --help` as a user would, a private runtime server
directory, the real runtime server served in the test's own process with host clients
of it, waiting for a side effect, the architectures and target images under test, and a
scripted sandbox that answers the injector as a fresh Debian container would."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.injector.jsonrpc_client import ExecRuntimeClient, StdioRuntimeClient
from sandbox_tools.injector.recon import CHECK_SCRIPT, PROBE_SCRIPT
from sandbox_tools.injector.source_runtime import RuntimeLaunch, local_source_runtime
from sandbox_tools.platforms import Arch
from sandbox_tools.protocol import KILL_GRACE_ENV, cwd_option
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.paths import server_paths
from sandbox_tools.runtime.server import RuntimeServer
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    CrawlerResult,
    GoParams,
    NewSessionParams,
)
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_TIMEOUT,
    MAX_STREAM_LINE,
    ExecOutput,
    Sandbox,
    Stream,
    StreamLineTooLong,
)
from sandbox_tools.sandboxes.local import LocalSandbox


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


# -- the real runtime server in this test's own process --------------------------------------
#
# SWE-ReX tests its host side against its real runtime served in-process; so do these. The
# server is `RuntimeServer` itself (its `serve()`, method table, controllers and limits),
# not a fake of it, on a private Unix socket; the host's own client classes talk to it.


class ServerSocketStream(Stream):
    """What the `runtime stdio` channel carries, without its bridge process: newline-
    delimited JSON-RPC on one connection to the server's socket, opened as the bridge
    opens its own (the caller's working directory first: jobs without `cwd` begin there)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, socket_path: str) -> ServerSocketStream:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=MAX_STREAM_LINE)
        writer.write(cwd_option())
        return cls(reader, writer)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def readline(self, limit: int = MAX_STREAM_LINE) -> bytes:
        try:
            line = await self._reader.readline()
        except ValueError:  # asyncio's way of saying the line overran the limit
            raise StreamLineTooLong(
                f"the stream sent more than {MAX_STREAM_LINE} bytes without a newline"
            ) from None
        if len(line) > limit:
            raise StreamLineTooLong(f"the stream sent a line of more than {limit} bytes")
        return line

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


class ServerSocketSandbox(LocalSandbox):
    """This machine, whose persistent stream is a connection to one runtime server's
    socket: a `StdioRuntimeClient` on it reaches that server with no process between.
    `exec` runs commands here, so an `ExecRuntimeClient` runs the real `exec` CLI."""

    def __init__(self, socket_path: str) -> None:
        super().__init__()
        self.name = "local (in-process runtime server)"
        self.socket_path = socket_path

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        if user is not None:
            raise NotImplementedError("the in-process runtime server is this test's own user")
        return await ServerSocketStream.connect(self.socket_path)


@dataclass
class InProcessRuntime:
    """The real runtime server on this test's event loop, and host clients of it."""

    server: RuntimeServer  # its `limits`, `controllers` and `paths`, to look at
    sandbox: ServerSocketSandbox
    launch: RuntimeLaunch  # the runtime from this checkout, pointed at the server's directory
    client: StdioRuntimeClient  # the injector's persistent-channel client, on the socket
    _exec_clients: list[ExecRuntimeClient] = field(default_factory=list)

    @property
    def directory(self) -> str:
        return self.server.paths.directory

    def exec_client(self) -> ExecRuntimeClient:
        """The exec-per-call client: each call one run of the real `exec` CLI from source
        (a child process, about 50 ms) reaching this server through its socket. Closed
        with the runtime."""
        client = ExecRuntimeClient(self.sandbox, self.launch.command, env=self.launch.env)
        self._exec_clients.append(client)
        return client

    async def close_clients(self) -> None:
        for client in (self.client, *self._exec_clients):
            with contextlib.suppress(Exception):
                await client.aclose()


# What RuntimeServer.serve() sets for a process of its own: put back when it stops.
_SIGNALS_THE_SERVER_TAKES = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE)
SERVER_START_TIMEOUT = 30.0
SERVER_STOP_TIMEOUT = 30.0


@contextlib.asynccontextmanager
async def serve_runtime_in_process(
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[InProcessRuntime]:
    """The real runtime server in this test's process: `RuntimeServer.serve()` as a task
    on the running event loop, in a private directory under /tmp that no other test
    shares (a parallel worker makes its own), limits read by `Limits.from_environ` from
    this process's environment with a 0.5 s kill grace (as `RuntimeDir`) and `environ`
    over both. Yields it with a `StdioRuntimeClient` connected straight to its socket.

    On exit, even when the body raised: the clients closed, the server asked to shut down
    as a host would (`sandbox_tools_shutdown`: its jobs, shells and MCP servers end), its
    directory removed, and what `serve()` changes in a process of its own put back here
    (the working directory, the signal handlers). A server that failed is raised then.

    Its pid is the test's own: a test that signals or stops the server, or that reaches
    it from synchronous code (`RuntimeDir.cli` would block the loop the server runs on),
    uses `runtime_dir`, a server in a child process."""
    directory = tempfile.mkdtemp(prefix="st-", dir="/tmp")  # socket paths: 107 bytes at most
    limits = Limits.from_environ({**os.environ, KILL_GRACE_ENV: "0.5", **(environ or {})})
    server = RuntimeServer(server_paths(directory), limits)
    loop = asyncio.get_running_loop()
    cwd = os.getcwd()
    handlers = {signum: signal.getsignal(signum) for signum in _SIGNALS_THE_SERVER_TAKES}
    serving = asyncio.create_task(server.serve())
    runtime: InProcessRuntime | None = None
    failure: BaseException | None = None
    try:
        await _listening(server, serving)
        os.chdir(cwd)  # serve() leaves for /, as a server that must hold no directory
        launch = local_source_runtime(directory)
        sandbox = ServerSocketSandbox(server.paths.socket)
        client = StdioRuntimeClient(sandbox, launch.command, env=launch.env)
        runtime = InProcessRuntime(server, sandbox, launch, client)
        yield runtime
    finally:
        if runtime is not None:
            await runtime.close_clients()
        failure = await _stopped(server, serving)
        os.chdir(cwd)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        shutil.rmtree(directory, ignore_errors=True)
    if failure is not None:
        raise AssertionError("the in-process runtime server failed") from failure


async def _listening(server: RuntimeServer, serving: asyncio.Task[None]) -> None:
    """Once the server's socket is there (it listens as it binds), or why it never was."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while not os.path.exists(server.paths.socket):
        if serving.done():
            serving.result()  # its exception, if it raised one
            raise AssertionError("the in-process runtime server ended before it listened")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the runtime server did not listen within {SERVER_START_TIMEOUT:g} s"
            )
        await asyncio.sleep(0.005)


async def _stopped(server: RuntimeServer, serving: asyncio.Task[None]) -> BaseException | None:
    """Ask the server to shut down and wait until it has; its failure, if it failed."""
    shutdown = server.methods.get("sandbox_tools_shutdown")
    if not serving.done():
        if shutdown is None:  # it never came as far as its method table
            serving.cancel()
        else:
            await shutdown({})
    done, _ = await asyncio.wait({serving}, timeout=SERVER_STOP_TIMEOUT)
    if not done:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return AssertionError(f"the runtime server did not stop within {SERVER_STOP_TIMEOUT:g} s")
    return None if serving.cancelled() else serving.exception()


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


def locked_down_busybox(
    client: Any, arch: Arch, tmp_size: str = "1g", user: str | None = "1000:1000"
) -> Any:
    """The hardest sandbox the browser meets, as a RunningContainer to enter: a static
    busybox and nothing else (no libc), uid 1000 (`user`; None: the image's root), a
    read-only root with an exec tmpfs of `tmp_size` at /tmp (HOME), and no network."""
    from sandbox_tools.sandboxes.containers import RunningContainer
    from sandbox_tools.sandboxes.images import ensure_busybox_image

    return RunningContainer(
        client,
        ensure_busybox_image(client, arch),
        platform=arch.platform,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": f"exec,size={tmp_size}"},
        user=user,
        environment={"HOME": "/tmp"},
    )


def site_handler(
    pages: dict[str, str], slow_seconds: float, slow_requested: threading.Event | None = None
) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler for `serve_site` serving `pages` by path: `/search?q` answers with what
    was searched, `/slow` sets `slow_requested`, waits `slow_seconds` and then shows
    `/next`; any other path is a 404. A test that must act while a slow page is under way
    waits for the event instead of guessing a time."""

    class Site(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/slow":
                if slow_requested is not None:
                    slow_requested.set()
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


# The platform and user lines of what the injector's probe prints in a fresh Debian 12
# container, as root.
PROBE_HEADER = b"""os_id=debian
os_version=12
arch=x86_64
libc=glibc
uid=0
user=root
sha256sum=yes
head_bytes=yes
home=/root
"""
# All of it, with every base judged.
GOOD = (
    PROBE_HEADER
    + b"""cand.0=ok|0|755|yes
cand.1=ok|0|1777|no
cand.2=ok|0|1777|no
cand.3=noexec|0|1777|no
cand.4=ok|0|700|no
"""
)


BUILD_ID = "sha256:" + "ab" * 32


class ScriptedDebian(Sandbox):
    """Answers the injector's fixed commands as a fresh Debian container would."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.files: dict[str, bytes] = {}

    async def exec(
        self,
        cmd: list[str],
        input: bytes | memoryview | str | None = None,
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
            request = json.loads(bytes(input) if isinstance(input, memoryview) else input or "{}")
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


def cache_without_built_runtimes(where: Path) -> Path:
    """A cache root at `where` sharing everything of this host's (roots, wheels, add-ons)
    but the runtimes it keeps by build id, for `SANDBOX_TOOLS_CACHE`: a build there
    really freezes (on the engine it names) instead of copying a kept artifact."""
    from sandbox_tools.cache import cache_root
    from sandbox_tools.settings import load_settings

    where.mkdir(parents=True, exist_ok=True)
    shared = cache_root(load_settings())
    shared.mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir():
        if entry.name != "runtime" and not entry.name.startswith("runtime."):
            (where / entry.name).symlink_to(entry)
    return where


class RawMcpServer:
    """`tools mcp` spoken to in raw JSON lines, initialized, for what the SDK's client
    does not do on command: a request cancelled at a chosen moment, a client that falls
    silent, a message no client would send; `cwd`: where it is started."""

    def __init__(self, env: Mapping[str, str], log: Path, cwd: Path | None = None) -> None:
        with log.open("w") as errlog:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sandbox_tools.cli", "mcp"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errlog,
                env=dict(env),
                cwd=cwd,
            )
        self.send(
            {
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            }
        )
        assert self.answer()["id"] == 0
        self.send({"method": "notifications/initialized"})

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        answered: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answered

    def call(self, request_id: int, tool: str, **arguments: Any) -> None:
        params = {"name": tool, "arguments": arguments}
        self.send({"id": request_id, "method": "tools/call", "params": params})

    def cancel(self, request_id: int) -> None:
        self.send({"method": "notifications/cancelled", "params": {"requestId": request_id}})

    def mine(self) -> dict[str, str]:
        """The engine's filter for the containers this server made."""
        from sandbox_tools.sandboxes.containers import OWNER_LABEL

        return {"label": f"{OWNER_LABEL}={self.process.pid}"}

    def close(self) -> int:
        """Close its stdin, as a client that goes away does; its exit code."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=60)

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def addon_record(archive: Path, *, located: bool = False) -> Any:
    """The record `tools build` would write for a browser add-on archive made by a test
    (its tree digest computed from it); `located`: as the injector finds it on disk."""
    import hashlib
    import io

    from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind
    from sandbox_tools.runtime.addons import digest_of_archive

    data = archive.read_bytes()
    return Artifact(
        name=archive.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        build_id="sha256:" + "1" * 64,
        tree=digest_of_archive(io.BytesIO(data)),
        path=archive if located else None,
    )


# A shared library that notes, in PLANTED_LOADED, the program of every process it is
# loaded into (a browser's processes show the add-on's loader there): what an image
# plants where a loader looks, in the add-on attack tests.
PLANTED_LIBRARY_SOURCE = r"""
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void noted(void) {
    char exe[512] = {0};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 2);
    if (n < 0) n = 0;
    exe[n] = '\n';
    int fd = open("/tmp/planted-loaded", O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { write(fd, exe, (size_t)n + 1); close(fd); }
}
"""
PLANTED_LOADED = "/tmp/planted-loaded"


def oversized_request_then_one(argv: list[str], env: dict[str, str], method: str) -> list[Any]:
    """What a `stdio` channel (`argv`) answers to a request line over the 64 MiB frame
    limit followed by a small `method` request (id 2): both relays must answer the big
    one once (-32600) and go on serving."""
    big = '{"jsonrpc":"2.0","id":1,"method":"version","params":{"x":"' + "x" * 70_000_000
    small = json.dumps({"jsonrpc": "2.0", "id": 2, "method": method})
    done = subprocess.run(
        argv,
        input=f'{big}"}}}}\n{small}\n',
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == 2, done.stdout[:500]
    assert answers[0]["error"]["code"] == -32600 and "larger" in answers[0]["error"]["message"]
    assert answers[1]["id"] == 2, answers[1]
    return answers


def repacked_without(source: Path, target: Path, leave_out: str) -> Path:
    """An add-on's tree as a tar.xz without one member (xz's fastest preset: only the
    static checks read it)."""
    import lzma
    import tarfile

    from sandbox_tools.build_containers.tree_archive import read_archive

    with lzma.open(target, "wb", preset=0) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        for member, content in read_archive(str(source)):
            if member.name != leave_out:
                tar.addfile(member, io.BytesIO(content) if member.isfile() else None)
    return target


def recorded_as_built(record: Any, path: Path) -> Any:
    """`record` for the add-on at `path`, as `tools build` would record it."""
    from dataclasses import replace

    from sandbox_tools.artifacts import sha256_of
    from sandbox_tools.runtime.addons import digest_of_archive

    with path.open("rb") as handle:
        tree = digest_of_archive(handle)
    return replace(record, size=path.stat().st_size, sha256=sha256_of(path), tree=tree)


def runtime_source() -> bytes:
    """The runtime's package as a tar for /opt/src of a container: its code run there
    with the image's python3 (`sys.path.insert(0, "/opt/src")`)."""
    import tarfile

    src = Path(__file__).resolve().parents[1] / "src"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path in sorted((src / "sandbox_tools").rglob("*.py")):
            relative = path.relative_to(src)
            if "runtime" in relative.parts or relative.parent == Path("sandbox_tools"):
                tar.add(path, arcname=str(relative))
    return out.getvalue()
