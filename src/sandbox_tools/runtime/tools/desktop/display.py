"""The desktop's X server and window manager, started and owned by the runtime.

The display is the agent's screen, but it must stay ours: whoever can connect to it can
read every pixel, type into every window and so act as the desktop's user. So:

- The X server runs with a fresh random cookie (MIT-MAGIC-COOKIE-1), never open to every
  client (`-ac`): its socket's abstract name is reachable from the whole network
  namespace, and only the cookie keeps another uid of the sandbox out. The cookie is in
  an authority file in the desktop's private directory (0700), given to what runs on the
  desktop through XAUTHORITY.
- The server chooses its display number itself (`-displayfd`): a number whose lock file
  or socket someone else holds first is skipped, not shared.
- The directory of the display sockets (/tmp/.X11-unix) must be root's or ours and not
  open to others unless sticky, as the runtime's own directories (paths.safe_for_us),
  and the display's socket there ours: a socket another uid could replace would hand
  it our cookie on the next connection.
- Before the desktop is used, the runtime's own X client connects with the cookie.

Programs are passed in (`Programs`): the desktop add-on's tree in the sandbox, an image's
own in tests. Standard library only, as the whole runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import stat
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox_tools.runtime.child_env import unprotect
from sandbox_tools.runtime.identity import SELF, Identity
from sandbox_tools.runtime.paths import safe_for_us
from sandbox_tools.runtime.tools.desktop.x11 import SOCKET_DIR, Display, X11Error

WIDTH, HEIGHT = 1366, 768  # FWXGA: inspect's computer tool scales nothing at this size
START_TIMEOUT = 10.0
STOP_GRACE = 2.0
AUTHORITY_FILE = "authority"
LOG_FILE = "xvfb.log"
# An authority entry for any address and any display number (Xlib's XauGetBestAuthByAddr
# takes an empty number for every display): the number is the server's to choose.
FAMILY_WILD = 0xFFFF
COOKIE_NAME = b"MIT-MAGIC-COOKIE-1"


class DesktopError(Exception):
    """The desktop cannot start or be used safely; the message says why and what to do."""


@dataclass(frozen=True)
class Programs:
    """The desktop's programs, each a command line to which arguments are added: the
    desktop add-on's `desktop PROGRAM` (its static launcher), an image's own in tests."""

    xvfb: tuple[str, ...]
    xdotool: tuple[str, ...]
    window_manager: tuple[str, ...] = ()
    # What every program of the desktop gets beside DISPLAY and XAUTHORITY.
    environment: dict[str, str] = field(default_factory=dict)


@dataclass
class Desktop:
    """A running desktop: its display number, cookie, and the processes of both."""

    display: int
    cookie: bytes
    directory: str
    # The directory as opened while it was still ours alone: its user may rename it and
    # put a link in its place, so whatever the runtime (maybe root) does in it later is
    # done through this descriptor, never by its path.
    directory_fd: int
    programs: Programs
    identity: Identity  # who its processes run as
    server: asyncio.subprocess.Process
    window_manager: asyncio.subprocess.Process | None
    width: int
    height: int

    @property
    def authority(self) -> str:
        return os.path.join(self.directory, AUTHORITY_FILE)

    def environment(self) -> dict[str, str]:
        """What a program needs to draw on this desktop and to send it input."""
        return {"DISPLAY": f":{self.display}", "XAUTHORITY": self.authority}

    def program_environment(self) -> dict[str, str]:
        """The whole environment of the desktop's own programs."""
        return {**self.programs.environment, **self.identity.env(), **self.environment()}

    async def run(self, *command: str, **options: Any) -> asyncio.subprocess.Process:
        """`command` started on this desktop as its identity, in a session of its own."""
        process = await asyncio.create_subprocess_exec(
            *command,
            env=self.program_environment(),
            start_new_session=True,
            user=self.identity.uid,
            group=self.identity.gid,
            extra_groups=self.identity.groups,
            **options,
        )
        unprotect(process.pid)
        return process

    def connect(self) -> Display:
        return Display(self.display, self.cookie)

    async def stop(self) -> None:
        """Both processes ended (TERM, then KILL after STOP_GRACE), the authority gone."""
        for process in (self.window_manager, self.server):
            if process is not None:
                await _end(process)
        if self.directory_fd >= 0:  # a second stop finds it closed
            with contextlib.suppress(FileNotFoundError):
                os.unlink(AUTHORITY_FILE, dir_fd=self.directory_fd)
            os.close(self.directory_fd)
            self.directory_fd = -1


def authority_entry(cookie: bytes) -> bytes:
    """One Xauthority entry: family, address, display number, name, data (big-endian
    lengths before each)."""

    def counted(data: bytes) -> bytes:
        return struct.pack(">H", len(data)) + data

    return (
        struct.pack(">H", FAMILY_WILD)
        + counted(b"")
        + counted(b"")
        + counted(COOKIE_NAME)
        + counted(cookie)
    )


def _new_file(directory_fd: int, name: str) -> int:
    """`name` made anew (0600) in the directory, open for reading and writing: whatever
    was there is removed first, and a link or file put there in between is refused,
    never followed or truncated."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory_fd)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    return os.open(name, flags, 0o600, dir_fd=directory_fd)


def _check_socket_directory() -> None:
    """/tmp/.X11-unix as the display's socket may live in it: made (sticky, as the X
    server makes it as root) where there is none, refused where another uid could
    replace what is in it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(SOCKET_DIR, 0o1777)
        os.chmod(SOCKET_DIR, 0o1777)  # the umask took the sticky and the others' bits
    if safe_for_us(SOCKET_DIR) != SOCKET_DIR:
        try:
            info = os.lstat(SOCKET_DIR)
            said = f"uid {info.st_uid}'s, mode {stat.S_IMODE(info.st_mode):o}"
        except OSError as exc:
            said = exc.strerror or str(exc)
        raise DesktopError(
            f"{SOCKET_DIR} is {said}: another user could replace the display's socket "
            "in it. Use an image where it is root's (mode 1777) or absent"
        )


def _check_socket(display: int, owner: int) -> None:
    path = f"{SOCKET_DIR}/X{display}"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return  # an X server run by another uid makes only the abstract socket
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != owner:
        raise DesktopError(
            f"{path} is not the desktop's socket (uid {info.st_uid}'s); refusing display :{display}"
        )


async def killed(process: asyncio.subprocess.Process) -> None:
    """`process`'s group killed (each program of the desktop has a session of its own),
    and the process waited for."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def _end(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), STOP_GRACE)
    except asyncio.TimeoutError:
        await killed(process)


def _log_tail(log: int) -> str:
    """The end of the X server's log, read through our descriptor of it (its path is in
    a directory its user may change)."""
    try:
        size = os.fstat(log).st_size
        return os.pread(log, 2000, max(0, size - 2000)).decode("utf-8", "replace").strip()
    except OSError:
        return ""


async def _display_number(
    reader: asyncio.StreamReader,
    server: asyncio.subprocess.Process,
    log: int,
    deadline: float,
) -> int:
    """The number the server wrote to its -displayfd once it accepts connections."""
    try:
        line = await asyncio.wait_for(reader.readline(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        await _end(server)
        raise DesktopError(
            f"the X server did not start within {START_TIMEOUT:.0f} s: {_log_tail(log)}"
        ) from None
    text = line.strip()
    if not text.isdigit() or len(text) > 5:
        await _end(server)
        raise DesktopError(f"the X server did not start: {_log_tail(log) or 'no log'}")
    return int(text)


async def start(
    programs: Programs,
    directory: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    identity: Identity = SELF,
) -> Desktop:
    """A desktop of `width` x `height` whose private files are in `directory`: the X
    server, checked, then the window manager, both as `identity`. The directory must be
    ours alone (0700; paths.private_directory makes one; made here where missing): its
    files are made through a descriptor of it, and only then is it given to `identity`."""
    _check_socket_directory()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        info = os.fstat(directory_fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise DesktopError(f"the desktop's directory {directory} is not ours alone")
        cookie = secrets.token_bytes(16)
        with os.fdopen(_new_file(directory_fd, AUTHORITY_FILE), "wb") as handle:
            if identity.uid is not None and identity.gid is not None:
                os.fchown(handle.fileno(), identity.uid, identity.gid)
            handle.write(authority_entry(cookie))
        log = _new_file(directory_fd, LOG_FILE)
        if identity.uid is not None and identity.gid is not None:
            os.fchown(directory_fd, identity.uid, identity.gid)
    except BaseException:
        os.close(directory_fd)
        raise
    try:
        return await _started(
            programs, directory, directory_fd, log, cookie, width, height, identity
        )
    except BaseException:
        os.close(directory_fd)
        raise
    finally:
        os.close(log)


async def _started(
    programs: Programs,
    directory: str,
    directory_fd: int,
    log: int,
    cookie: bytes,
    width: int,
    height: int,
    identity: Identity,
) -> Desktop:
    try:
        server, display = await _server(programs, directory, log, width, height, identity)
    except BaseException:
        os.close(directory_fd)
        raise
    desktop = Desktop(
        display, cookie, directory, directory_fd, programs, identity, server, None, width, height
    )
    try:
        _check_socket(display, os.geteuid() if identity.uid is None else identity.uid)
        with desktop.connect() as connection:
            if (connection.screen.width, connection.screen.height) != (width, height):
                raise DesktopError(
                    f"display :{display} is {connection.screen.width} x "
                    f"{connection.screen.height}, not the {width} x {height} we started"
                )
        if programs.window_manager:
            desktop.window_manager = await desktop.run(
                *programs.window_manager,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
    except BaseException as exc:
        await desktop.stop()
        if isinstance(exc, (DesktopError, asyncio.CancelledError)) or not isinstance(
            exc, (X11Error, OSError)
        ):
            raise
        raise DesktopError(f"the desktop on display :{display} cannot be used: {exc}") from None
    return desktop


async def _server(
    programs: Programs,
    directory: str,
    log: int,
    width: int,
    height: int,
    identity: Identity,
) -> tuple[asyncio.subprocess.Process, int]:
    """The X server started and accepting connections, and its display number."""
    authority = os.path.join(directory, AUTHORITY_FILE)  # read by the X server, as its user
    read_end, write_end = os.pipe()
    deadline = time.monotonic() + START_TIMEOUT
    try:
        server = await asyncio.create_subprocess_exec(
            *programs.xvfb,
            "-displayfd",
            str(write_end),
            "-screen",
            "0",
            f"{width}x{height}x24",
            "-auth",
            authority,
            "-nolisten",
            "tcp",
            "-noreset",  # with no client left it would reset: pointer and windows gone
            "-extension",
            "GLX",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write_end,),
            start_new_session=True,
            env={**programs.environment, **identity.env()},
            user=identity.uid,
            group=identity.gid,
            extra_groups=identity.groups,
        )
        unprotect(server.pid)
    except OSError as exc:
        os.close(read_end)
        raise DesktopError(f"cannot start the X server {programs.xvfb[0]}: {exc}") from None
    finally:
        os.close(write_end)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", buffering=0)
    )
    try:
        display = await _display_number(reader, server, log, deadline)
    finally:
        transport.close()
    return server, display
