"""The runtime's command line: the stateless front door to the stateful server.

`exec` runs once per tool call, so this module and everything it imports on that
path are standard library only and cheap; the server (asyncio, the tools) is
imported only by the `server` subcommand.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox_tools._version import __version__
from sandbox_tools.protocol import (
    INTERNAL_ERROR,
    JSONRPC_VERSION,
    MAX_FRAME_BYTES,
    RESPONSE_LIMIT_OPTION,
    RUNTIME_SERVER_LOST,
    cwd_option,
)
from sandbox_tools.runtime.client import (
    ServerUnavailable,
    call,
    connect,
    notify,
    read_frame,
    server_is_running,
    try_connect,
)
from sandbox_tools.runtime.jsonrpc import (
    RpcError,
    encode,
    error_response,
    loads_document,
    request_id_of,
    validate_request,
)
from sandbox_tools.runtime.paths import ServerDirError, ServerPaths, server_paths

USAGE = """\
usage: sandbox-tools-runtime COMMAND [ARGS]

commands:
  exec [REQUEST]   answer one JSON-RPC request (argument, or stdin when omitted)
  stdio            serve newline-delimited JSON-RPC on stdin/stdout until EOF
  server [--dir D] run the server in the foreground
  start-server     start the server unless it runs
  stop-server      ask the server to shut down and wait until it has
  healthcheck      exit 0 only if this CLI and the server both answer `version`
  unpack           make the runtime ready to run (the portable launcher unpacks itself)
  addon-check DEST DIGEST [SIGNATURE]
                   whether the add-on tree at DEST is the pinned one (JSON); with the
                   stat SIGNATURE an earlier check gave, an unchanged tree is not hashed
  addon-install DEST DIGEST TREE_BYTES tar.xz|tar
                   unpack the add-on archive read from stdin into DEST, checked first
  model_proxy [--port N] [--timeout S]
                   serve HTTP on 127.0.0.1:N (13131) inside the sandbox, answered by the host
  browser-mcp      serve a headless Chromium as an MCP server on stdin/stdout
  --version        print the runtime version
"""


def _write_line(payload: bytes) -> None:
    sys.stdout.buffer.write(payload if payload.endswith(b"\n") else payload + b"\n")
    sys.stdout.buffer.flush()


def _unavailable(request_id: Any, reason: str) -> bytes:
    return encode(
        error_response(
            request_id,
            RpcError(INTERNAL_ERROR, f"runtime server unavailable: {reason}", data=reason),
        )
    )


def _to_frame(raw: bytes) -> tuple[bytes | None, Any, bytes | None]:
    """Validate one request locally: (frame to forward, its id, or an error response)."""
    try:
        request = validate_request(document := loads_document(raw))
    except RpcError as exc:
        return None, None, encode(error_response(request_id_of(raw), exc))
    return encode(document), (None if request.is_notification else request.id), None


def cmd_exec(paths: ServerPaths, argv: list[str]) -> int:
    # os.fsencode: argv that is not UTF-8 arrives surrogate-escaped; these are its bytes.
    raw = os.fsencode(argv[0]) if argv else sys.stdin.buffer.read(MAX_FRAME_BYTES + 1)
    frame, request_id, error = _to_frame(raw)
    if frame is None:
        assert error is not None
        _write_line(error)
        return 0
    if request_id is None:
        # A notification: delivered, and answered with nothing, as JSON-RPC says (inspect_ai's
        # exec_notification takes any output for a failure).
        try:
            notify(paths, frame)
        except (ServerUnavailable, ServerDirError, OSError) as exc:
            print(f"sandbox-tools: notification not delivered: {exc}", file=sys.stderr)
            return 1
        return 0
    # Only `exec` needs the limits (and their dataclasses): the bridge starts without.
    from sandbox_tools.runtime.limits import caller_response_limit

    limit = caller_response_limit(os.environ)
    if limit is not None:
        # The caller's exec output is capped: the server holds what would not fit.
        frame = RESPONSE_LIMIT_OPTION + str(limit).encode() + b"\n" + frame
    frame = cwd_option() + frame
    try:
        _write_line(call(paths, frame))
    except (ServerUnavailable, ServerDirError, OSError) as exc:
        _write_line(_unavailable(request_id, str(exc)))
    return 0


class _StdioBridge:
    """Copies requests from stdin to the server and responses back, in both directions at once.

    Responses may arrive out of order (the server answers each when ready). If the
    server connection is lost, requests still waiting get an error instead of silence
    and the next request starts a fresh server.
    """

    def __init__(self, paths: ServerPaths) -> None:
        self.paths = paths
        self.out_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.outstanding: dict[int, set[Any]] = {}
        self.readers: list[threading.Thread] = []
        self.closing = False  # stdin ended: connections close because we close them
        self.cwd_line = cwd_option()  # the sandbox's working directory for this channel

    def emit(self, payload: bytes) -> None:
        with self.out_lock:
            _write_line(payload)

    def _reader(self, sock: socket.socket) -> None:
        buffer = bytearray()
        key = id(sock)
        try:
            while True:
                frame = read_frame(sock, buffer)
                if frame is None:
                    break
                self.emit(frame)
                response_id = request_id_of(frame)
                with self.state_lock:
                    self.outstanding.get(key, set()).discard(response_id)
        except (OSError, ServerUnavailable):
            pass
        with self.state_lock:
            lost = self.outstanding.pop(key, set())
            if self.sock is sock:
                self.sock = None
        for request_id in lost:
            self.emit(_unavailable(request_id, "connection to the runtime server was lost"))
        if not self.closing:
            # A subscription to host messages lived on that connection: say it is gone,
            # so the host subscribes again instead of waiting for messages that never come.
            lost_note = {
                "jsonrpc": JSONRPC_VERSION,
                "method": RUNTIME_SERVER_LOST,
                "params": {"reason": "connection to the runtime server was lost"},
            }
            with contextlib.suppress(OSError, ValueError):
                self.emit(json.dumps(lost_note).encode())
        sock.close()

    def _connection(self) -> socket.socket:
        with self.state_lock:
            if self.sock is not None:
                return self.sock
        sock = connect(self.paths)
        if self.cwd_line:
            sock.sendall(self.cwd_line)  # where jobs started without `cwd` begin
        with self.state_lock:
            self.sock = sock
            self.outstanding[id(sock)] = set()
        thread = threading.Thread(target=self._reader, args=(sock,), daemon=True)
        thread.start()
        self.readers.append(thread)
        return sock

    def send(self, frame: bytes, request_id: Any) -> None:
        for attempt in range(2):
            try:
                sock = self._connection()
                with self.state_lock:
                    if request_id is not None:
                        self.outstanding.setdefault(id(sock), set()).add(request_id)
                sock.sendall(frame)
                return
            except (OSError, ServerUnavailable) as exc:
                with self.state_lock:
                    if request_id is not None:
                        for waiting in self.outstanding.values():
                            waiting.discard(request_id)
                    self.sock = None
                if attempt == 1:
                    if request_id is not None:
                        self.emit(_unavailable(request_id, str(exc)))
                    return

    def run(self) -> int:
        _each_stdin_request(self.send, self.emit)
        self.closing = True
        with self.state_lock:
            sock = self.sock
        if sock is not None:
            # Half-close: the server answers what it has and then closes its side.
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        for thread in self.readers:
            thread.join()
        return 0


def _each_stdin_request(
    handle: Callable[[bytes, Any], None], emit: Callable[[bytes], None]
) -> None:
    """Every request line on stdin, validated: `handle(frame, id)`, or its error emitted."""
    for raw in sys.stdin.buffer:
        if not raw.strip():
            continue
        frame, request_id, error = _to_frame(raw)
        if frame is None:
            assert error is not None
            emit(error)
        else:
            handle(frame, request_id)


def _answer_all_with(reason: str) -> int:
    """Serve a stdio channel that cannot reach a server: every request gets the reason."""
    print(f"sandbox-tools runtime: {reason}", file=sys.stderr)

    def refuse(_: bytes, request_id: Any) -> None:
        if request_id is not None:
            _write_line(_unavailable(request_id, reason))

    _each_stdin_request(refuse, _write_line)
    return 1


def cmd_start_server(paths: ServerPaths) -> int:
    connect(paths).close()
    return 0


def cmd_stop_server(paths: ServerPaths) -> int:
    request = encode({"jsonrpc": JSONRPC_VERSION, "id": 1, "method": "sandbox_tools_shutdown"})
    deadline = time.monotonic() + 10
    asked = False
    while server_is_running(paths):
        if not asked:
            # Asked again until it answers: a server whose socket vanished listens again
            # within a second.
            sock = try_connect(paths)
            if sock is not None:
                sock.close()
                with contextlib.suppress(ServerUnavailable, OSError):
                    call(paths, request)
                    asked = True
        if time.monotonic() > deadline:
            print("the runtime server did not stop within 10 s", file=sys.stderr)
            return 1
        time.sleep(0.02)
    return 0


def cmd_healthcheck(paths: ServerPaths) -> int:
    request = encode({"jsonrpc": JSONRPC_VERSION, "id": 1, "method": "version"})
    try:
        sock = try_connect(paths)
        if sock is None:
            print("unhealthy: the runtime server is not running", file=sys.stderr)
            return 1
        sock.close()
        response = json.loads(call(paths, request))
    except (ServerUnavailable, OSError, ValueError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    if response.get("result") != __version__:
        print(f"unhealthy: server answered {response!r}, CLI is {__version__}", file=sys.stderr)
        return 1
    print(f"healthy: CLI and server {__version__}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "--version":
        print(__version__)
        return 0
    if command == "unpack":  # only the portable launcher has anything to unpack
        return 0
    if command in ("addon-check", "addon-install"):  # the installer's fixed commands
        from sandbox_tools.runtime.addons import main as addon_main

        return addon_main([command.removeprefix("addon-"), *rest])
    if command == "model_proxy":  # HTTP inside the sandbox, answered by the host
        from sandbox_tools.runtime.model_proxy import run

        return run(rest)
    if command == "browser-mcp":  # its own browser, no runtime server; imported only here
        from sandbox_tools.runtime.tools.web_browser.mcp_server import run as run_browser_mcp

        return run_browser_mcp(rest)
    directory = None
    if command == "server" and rest[:1] == ["--dir"] and len(rest) >= 2:
        directory = rest[1]
    try:
        paths = server_paths(directory)
        if command == "exec":
            return cmd_exec(paths, rest)
        if command == "stdio":
            return _StdioBridge(paths).run()
        if command == "server":
            from sandbox_tools.runtime.server import run_server

            return run_server(paths)
        if command == "start-server":
            return cmd_start_server(paths)
        if command == "stop-server":
            return cmd_stop_server(paths)
        if command == "healthcheck":
            return cmd_healthcheck(paths)
    except (ServerDirError, ServerUnavailable) as exc:
        if command == "exec":  # the caller expects a JSON-RPC response, even for this
            _write_line(_unavailable(None, str(exc)))
            return 0
        if command == "stdio":  # the host reads responses, not our stderr: answer each
            return _answer_all_with(str(exc))
        print(f"sandbox-tools runtime: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    os._exit(main())
