"""The CLI's side of the server socket: connect, or start the server exactly once.

This is on the per-call path, so it uses only cheap standard-library modules.
Start-up protocol (the static launcher of the portable artifact follows it too):
1. connect to the socket; success -> use it;
2. otherwise take `start.lock` (flock), connect again (a racing CLI may have
   started the server meanwhile), and if that fails too, remove the stale socket
   and spawn `<self> server`; wait until the socket accepts; release the lock.
The server additionally holds `server.lock` for its lifetime and refuses to
start when it cannot get it, so two servers never share a directory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import sys
import time

from sandbox_tools.protocol import (
    FRAME_TERMINATOR,
    LAUNCHER_SELF_ENV,
    MAX_FRAME_BYTES,
    SERVER_DIR_ENV,
)
from sandbox_tools.runtime.paths import ServerDirError, ServerPaths

SERVER_START_TIMEOUT = 30.0


class ServerUnavailable(Exception):
    """The server could not be reached or started; the message says why."""


def self_command() -> list[str]:
    """How to launch this runtime again (to start the server).

    The portable launcher exports LAUNCHER_SELF_ENV because `sys.executable`
    (the PyInstaller bootloader) cannot be started directly in libc-free images.
    """
    launcher = os.environ.get(LAUNCHER_SELF_ENV)
    if launcher:
        return [launcher]
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "sandbox_tools.runtime"]


def _check_socket_owner(path: str) -> None:
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise ServerDirError(
            f"{path!r} is not a socket owned by uid {os.geteuid()}; refusing to talk to it. "
            f"Remove it or point {SERVER_DIR_ENV} elsewhere"
        )


def try_connect(paths: ServerPaths) -> socket.socket | None:
    try:
        _check_socket_owner(paths.socket)
    except FileNotFoundError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(paths.socket)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN):
            return None
        raise ServerUnavailable(f"cannot connect to {paths.socket}: {exc.strerror}") from None
    return sock


def server_is_running(paths: ServerPaths) -> bool:
    """True while some process holds the server's lifetime lock."""
    try:
        fd = os.open(paths.running_lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def connect(paths: ServerPaths, start: bool = True) -> socket.socket:
    sock = try_connect(paths)
    if sock is not None:
        return sock
    if not start:
        raise ServerUnavailable("the runtime server is not running")
    lock_fd = os.open(paths.start_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        sock = try_connect(paths)
        if sock is not None:
            return sock
        return _start_server(paths)
    finally:
        os.close(lock_fd)


def _start_server(paths: ServerPaths) -> socket.socket:
    if not server_is_running(paths):
        # Nobody serves this directory: whatever socket is left is stale.
        try:
            os.unlink(paths.socket)
        except FileNotFoundError:
            pass
        import subprocess  # only to start a server: not on every bridge's start

        log = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Own session and no inherited pipes: `docker exec` waits for every holder
            # of its stdout, so the server must not keep ours open.
            subprocess.Popen(
                [*self_command(), "server", "--dir", paths.directory],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(log)
    return _wait_for_server(paths)


# How often a client looks for the socket of a server that is starting: often while a
# start may still be quick (about 0.1 s from an unpacked tree), rarely after. A cap of
# 50 ms from the start made a first answer wait up to 50 ms past the server being ready.
QUICK_POLL_S = 0.004
QUICK_POLL_FOR_S = 2.0
SLOW_POLL_S = 0.05


def _wait_for_server(paths: ServerPaths) -> socket.socket:
    started = time.monotonic()
    deadline = started + SERVER_START_TIMEOUT
    delay = 0.001
    while time.monotonic() < deadline:
        sock = try_connect(paths)
        if sock is not None:
            return sock
        time.sleep(delay)
        quick = time.monotonic() - started < QUICK_POLL_FOR_S
        delay = min(delay * 2, QUICK_POLL_S if quick else SLOW_POLL_S)
    raise ServerUnavailable(
        f"the runtime server did not start within {SERVER_START_TIMEOUT:.0f} s; "
        f"see its log at {paths.log}"
    )


def read_frame(sock: socket.socket, buffer: bytearray) -> bytes | None:
    """Return the next newline-terminated frame (without the newline), or None at EOF."""
    while True:
        end = buffer.find(FRAME_TERMINATOR)
        if end >= 0:
            frame = bytes(buffer[:end])
            del buffer[: end + 1]
            return frame
        if len(buffer) > MAX_FRAME_BYTES:
            raise ServerUnavailable("the runtime server sent an oversized frame")
        chunk = sock.recv(1 << 20)
        if not chunk:
            return None
        buffer += chunk


def call(paths: ServerPaths, frame: bytes) -> bytes:
    """Send one request frame, return the response frame (starting the server if needed)."""
    sock = connect(paths)
    try:
        sock.sendall(frame)
        response = read_frame(sock, bytearray())
    finally:
        sock.close()
    if response is None:
        raise ServerUnavailable(
            f"the runtime server closed the connection without answering; see {paths.log}"
        )
    return response


def notify(paths: ServerPaths, frame: bytes) -> None:
    """Deliver a notification and wait until the server has handled it (it then closes)."""
    sock = connect(paths)
    try:
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(1 << 16):
            pass  # nothing is expected; a server would only ever close
    finally:
        sock.close()
