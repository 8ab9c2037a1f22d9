"""The stateful runtime server: newline-delimited JSON-RPC over a Unix socket.

One connection may carry many requests; each is handled concurrently and its
response written as soon as it is ready (matched by id), which is what the
persistent `stdio` channel relies on. A frame that cannot be read as a request
gets an error response; nothing a client sends stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import stat
import sys
import time
from collections.abc import Mapping
from typing import Any

from sandbox_tools.protocol import (
    CWD_OPTION,
    INVALID_REQUEST,
    MAX_FRAME_BYTES,
    RESPONSE_CHUNK_FIELD,
    RESPONSE_CHUNK_METHOD,
    RESPONSE_LIMIT_MAX_DIGITS,
    RESPONSE_LIMIT_OPTION,
)
from sandbox_tools.runtime.build_info import build_info
from sandbox_tools.runtime.child_env import protect_from_oom
from sandbox_tools.runtime.chunks import HeldResponses
from sandbox_tools.runtime.host_messages import CURRENT_CONNECTION, Connection
from sandbox_tools.runtime.jsonrpc import (
    CALLER_CWD,
    Method,
    RpcError,
    dispatch,
    encode,
    error_response,
)
from sandbox_tools.runtime.limits import Limits, LimitsError
from sandbox_tools.runtime.methods import Controllers, all_methods
from sandbox_tools.runtime.paths import ServerPaths

GC_INTERVAL_S = 60.0
SOCKET_CHECK_S = 0.5
SHUTDOWN_DRAIN_S = 0.5


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} [{os.getpid()}] {message}", file=sys.stderr, flush=True)


class AlreadyRunning(Exception):
    pass


def _open_lock(path: str, new: bool = False) -> int:
    """The lock file, made if missing, never through a link; `new`: only a file this
    call makes (O_EXCL), so that one somebody else made first is not taken for ours."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags | (os.O_EXCL if new else 0), 0o600)


def _locked(fd: int) -> bool:
    """Whether this process now holds the exclusive lock on `fd` (never waits)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# Formats whose code can vanish under a running server: staticx unpacks the program
# into a temporary directory it removes once the command that started the server
# ends, and a tool imported on its first call would then find nothing to import.
LOADS_EVERY_TOOL_AT_START = frozenset({"staticx"})


class RuntimeServer:
    def __init__(self, paths: ServerPaths, limits: Limits) -> None:
        self.paths = paths
        self.limits = limits
        self._stop = asyncio.Event()
        self._lock_fd: int | None = None
        self.controllers: Controllers | None = None
        self.methods: Mapping[str, Method] = {}
        self._in_flight: set[asyncio.Task[None]] = set()
        self._socket_inode: int | None = None
        self._home: tuple[int, int] | None = None  # the directory's (device, inode)
        self._owner = True  # False once this server stepped down: touch nothing there
        self.held = HeldResponses()

    def _take_lifetime_lock(self) -> None:
        """Hold the directory for the server's life: an exclusive lock the kernel keeps on
        one lock file, and the identity of the directory that file is in. Every later
        check compares both, so ownership is decided by the kernel, never by timing."""
        info = os.lstat(self.paths.directory)
        self._home = (info.st_dev, info.st_ino)
        fd = _open_lock(self.paths.running_lock)
        if not _locked(fd):
            os.close(fd)
            raise AlreadyRunning(f"another server already serves {self.paths.directory}")
        self._lock_fd = fd

    def _lost_ownership(self) -> str | None:
        """Why this server no longer owns its directory, or None while it does. The lock
        file gone (a cleaner) is taken again where nobody else took it first."""
        try:
            info = os.lstat(self.paths.directory)
        except FileNotFoundError:
            return "its directory is gone"
        except OSError as exc:
            return f"its directory cannot be checked: {exc.strerror}"
        if (info.st_dev, info.st_ino) != self._home:
            return "its directory was replaced"
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.geteuid()
            or stat.S_IMODE(info.st_mode) & 0o022
        ):
            return "its directory's owner or mode changed"
        assert self._lock_fd is not None
        held = os.fstat(self._lock_fd)
        try:
            current = os.lstat(self.paths.running_lock)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            return None
        try:
            fd = _open_lock(self.paths.running_lock, new=current is None)
        except OSError:
            return "its lock file was replaced"
        if not _locked(fd):
            os.close(fd)
            return "another server holds its directory"
        os.close(self._lock_fd)  # the old file is unlinked: nobody can meet that lock
        self._lock_fd = fd
        _log(f"lock file {self.paths.running_lock} was removed; holding a new one")
        return None

    def _previous_server_note(self) -> str | None:
        """A pid file left behind means the previous server died without shutting down."""
        try:
            with open(self.paths.pid_file, encoding="ascii") as handle:
                previous = handle.read().strip()
        except OSError:
            return None
        return (
            f"the runtime server was restarted (the previous server, pid {previous}, "
            "ended without a clean shutdown) and the processes it was running are lost"
        )

    async def serve(self) -> None:
        # The server holds no directory that can vanish: the one it was started in may be
        # a sample's temporary directory, removed long before the server ends.
        os.chdir("/")
        self._take_lifetime_lock()
        note = self._previous_server_note()
        if note:
            _log(note)
        with open(self.paths.pid_file, "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))
        self.controllers = Controllers(
            self.limits, lost_jobs_note=note, state_directory=self.paths.directory
        )
        if build_info()["format"] in LOADS_EVERY_TOOL_AT_START:
            self.controllers.load_all()
        self.methods = all_methods(
            self.paths.directory,
            self._stop.set,
            self.controllers,
            {RESPONSE_CHUNK_METHOD: self.held.continuation},
        )
        servers = [await self._listen()]
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        gc_task = asyncio.create_task(self._collect_garbage())
        watch_task = asyncio.create_task(self._keep_socket(servers))
        _log(f"server started on {self.paths.socket}")
        try:
            await self._stop.wait()
        finally:
            _log("server stopping")
            watch_task.cancel()
            for server in servers:
                server.close()
            if self._in_flight:
                # Let answers already computed (the shutdown request's own) reach their clients.
                await asyncio.wait(self._in_flight, timeout=SHUTDOWN_DRAIN_S)
            gc_task.cancel()
            await self.controllers.shutdown()
            # Only what is still ours: a server that stepped down leaves the owner's
            # socket and pid file where they are.
            if self._owner and self._lost_ownership() is None:
                with contextlib.suppress(OSError):
                    if os.lstat(self.paths.socket).st_ino == self._socket_inode:
                        os.unlink(self.paths.socket)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.paths.pid_file)

    async def _listen(self) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.paths.socket)
        old_umask = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(
                self._handle_connection, path=self.paths.socket, limit=MAX_FRAME_BYTES
            )
        finally:
            os.umask(old_umask)
        self._socket_inode = os.lstat(self.paths.socket).st_ino
        return server

    async def _keep_socket(self, servers: list[asyncio.AbstractServer]) -> None:
        """Stay the owner of the directory, or leave. While this server holds it (the same
        directory, its lock), a socket file that vanished or was replaced (a tmp cleaner,
        or anything running as our uid) is made again: otherwise every later call waited
        30 s and failed, and stop-server could not reach us. A server that lost the
        directory (gone, replaced, or held by another server) exits, touching nothing
        there: two servers of one build once took one socket from each other forever."""
        while True:
            await asyncio.sleep(SOCKET_CHECK_S)
            reason = self._lost_ownership()
            if reason is not None:
                _log(f"stepping down: {reason}; this server exits")
                self._owner = False
                self._stop.set()
                return
            try:
                current = os.lstat(self.paths.socket).st_ino
            except FileNotFoundError:
                current = None
            except OSError:
                continue
            if current != self._socket_inode:
                _log(f"socket {self.paths.socket} vanished or was replaced; listening again")
                try:
                    servers.append(await self._listen())
                except OSError as exc:
                    _log(f"cannot listen on {self.paths.socket} again: {exc}")

    async def _collect_garbage(self) -> None:
        while True:
            await asyncio.sleep(GC_INTERVAL_S)
            if self.controllers is not None and self.controllers.loaded("exec_remote"):
                await self.controllers.exec_remote.collect_garbage()

    async def _handle_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        write_lock = asyncio.Lock()
        pending: set[asyncio.Task[None]] = set()
        limit: int | None = None  # the caller's exec output limit, if it told us one

        async def respond(message: dict[str, Any]) -> None:
            frame = encode(message)
            if RESPONSE_CHUNK_FIELD not in message:
                frame = self.held.fit(frame, limit)
            async with write_lock:
                with contextlib.suppress(ConnectionError):
                    writer.write(frame)
                    await writer.drain()

        async def push(message: dict[str, Any]) -> bool:
            """A message the sandbox sends first, on this connection (host_messages)."""
            if writer.is_closing():
                return False
            async with write_lock:
                try:
                    writer.write(encode(message))
                    await writer.drain()
                except ConnectionError:
                    return False
            return True

        # For host_messages_subscribe, in this connection's tasks.
        CURRENT_CONNECTION.set(Connection(push, lambda: not writer.is_closing()))

        async def handle(line: bytes) -> None:
            response = await dispatch(self.methods, line)
            if response is not None:
                await respond(response)

        try:
            while True:
                try:
                    line = await reader.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    await respond(
                        error_response(
                            None,
                            RpcError(
                                INVALID_REQUEST,
                                f"Invalid Request: frame larger than {MAX_FRAME_BYTES} bytes",
                            ),
                        )
                    )
                    break
                except ConnectionError:
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                if line.startswith(CWD_OPTION):
                    value = line[len(CWD_OPTION) :].rstrip(b"\r\n")
                    if value.startswith(b"/") and b"\x00" not in value:
                        CALLER_CWD.set(os.fsdecode(value))  # for this connection's requests
                    continue
                if line.startswith(RESPONSE_LIMIT_OPTION):
                    value = line[len(RESPONSE_LIMIT_OPTION) :].strip()
                    digits = 0 < len(value) <= RESPONSE_LIMIT_MAX_DIGITS
                    limit = int(value) if value.isdigit() and digits else None
                    limit = limit or None
                    continue
                task = asyncio.create_task(handle(line))
                pending.add(task)
                task.add_done_callback(pending.discard)
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            with contextlib.suppress(ConnectionError):
                writer.close()
                await writer.wait_closed()


def run_server(paths: ServerPaths) -> int:
    # The limits are read here, once, before anything is served: every tool of this server
    # uses the same values, and a value that cannot be used is said in the log, not as a
    # traceback from deep inside a tool.
    try:
        limits = Limits.from_environ(os.environ)
    except LimitsError as exc:
        _log(f"the runtime server cannot start: {exc}")
        return 1
    protect_from_oom()
    try:
        asyncio.run(RuntimeServer(paths, limits).serve())
    except AlreadyRunning as exc:
        _log(str(exc))
        return 0
    return 0
