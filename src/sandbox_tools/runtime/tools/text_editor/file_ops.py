"""The file operations text_editor needs, with every failure turned into a ToolError.

Paths are only ever passed to system calls: never to a shell, never into a command
string. `UserFileAccess` performs the same operations as another user in a forked
child running under that uid/gid, so the kernel checks the permissions, not us.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import json
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from sandbox_tools.runtime.identity import Identity, become
from sandbox_tools.runtime.jsonrpc import ToolError

MAX_LISTED_ENTRIES = 1000
# A file operation as another user runs in a child; it may take this long at most.
FILE_OP_TIMEOUT = 60.0


def _fail(path: str, exc: OSError) -> ToolError:
    if exc.errno == errno.ENOENT:
        return ToolError(f"the path {path} does not exist")
    if exc.errno == errno.ENAMETOOLONG:
        return ToolError(f"the path {path[:80]}... is too long (a name exceeds the limit)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ToolError(f"permission denied: {path}")
    if exc.errno == errno.EISDIR:
        return ToolError(f"the path {path} is a directory, not a file")
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"a component of the path {path} is not a directory")
    if exc.errno == errno.EROFS:
        return ToolError(f"the path {path} is on a read-only file system")
    return ToolError(f"cannot access {path}: {exc.strerror or exc}")


def kind(path: str) -> str:
    """ "file", "directory", "other" or "missing"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise _fail(path, exc) from None
    if stat.S_ISREG(mode):
        return "file"
    return "directory" if stat.S_ISDIR(mode) else "other"


def _open_regular(path: str, flags: int) -> tuple[int, os.stat_result]:
    """Open `path` without ever blocking on it, and only if it is a regular file.

    O_NONBLOCK: opening a FIFO (planted, or swapped in after a check) returns at once
    instead of waiting for a writer, and fstat on the open descriptor then refuses it;
    nothing is checked by name and opened later, so there is no race to win.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _fail(path, exc) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ToolError(f"the path {path} is not a regular file (a FIFO, device or socket?)")
    os.set_blocking(fd, True)
    return fd, info


def read_text(path: str, max_bytes: int) -> str:
    """The file's UTF-8 text; a file over `max_bytes` (`Limits.text_editor_max_bytes`)
    is refused: bigger files are read and changed with commands."""
    fd, info = _open_regular(path, os.O_RDONLY)
    limit = max_bytes
    try:
        if info.st_size > limit:
            raise ToolError(
                f"{path} is {info.st_size} bytes, more than text_editor handles ({limit}); "
                "use a command (sed -n, head, grep) to read or change parts of it"
            )
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise _fail(path, exc) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ToolError(f"{path} grew past {limit} bytes while it was read")
    if b"\x00" in data:
        raise ToolError(f"{path} is a binary file; text_editor only edits UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(
            f"{path} is not UTF-8 text (a binary file?); text_editor only edits UTF-8 text"
        ) from None


def _write_temporary(directory: str, data: bytes, mode: int, owner: tuple[int, int] | None) -> str:
    """A fsynced file beside the target, with the target's mode (and owner, as root)."""
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".sandbox-tools-edit-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if owner is not None and os.geteuid() == 0:
                os.fchown(handle.fileno(), *owner)
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return temporary


def write_text(path: str, text: str, create_only: bool = False) -> None:
    """Replace (or create) the file atomically: a failure part-way leaves the old file.

    The new bytes go to a temporary file in the same directory, are fsynced and then
    renamed over the target (or hard-linked into place for `create`, which never
    overwrites). Mode and owner are kept. A symlink is followed: its target is edited.
    """
    data = text.encode("utf-8")
    try:
        if create_only:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            umask = os.umask(0)
            os.umask(umask)
            temporary = _write_temporary(parent or ".", data, 0o666 & ~umask, None)
            try:
                os.link(temporary, path)  # fails if anything exists there: no overwrite
            finally:
                os.unlink(temporary)
            return
        target = os.path.realpath(path)
        fd, info = _open_regular(target, os.O_RDONLY)
        os.close(fd)
        temporary = _write_temporary(
            os.path.dirname(target), data, stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
        )
        try:
            os.rename(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except FileExistsError:
        raise ToolError(
            f"file already exists at {path}; `create` never overwrites: use str_replace or "
            "insert to change it"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ToolError(f"no space left to write {path}; the file was not changed") from None
        raise _fail(path, exc) from None


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        raise _fail(path, exc) from None


def list_tree(path: str, depth: int = 2) -> list[str]:
    """Non-hidden entries up to `depth` levels below `path`, sorted, as full paths."""
    entries: list[str] = []

    def walk(directory: str, level: int) -> None:
        try:
            with os.scandir(directory) as scan:
                children = sorted(scan, key=lambda entry: entry.name)
        except OSError as exc:
            if directory == path:
                raise _fail(path, exc) from None
            return
        for child in children:
            if child.name.startswith("."):
                continue
            entries.append(child.path)
            if len(entries) >= MAX_LISTED_ENTRIES:
                return
            if level < depth and child.is_dir(follow_symlinks=False):
                walk(child.path, level + 1)
                if len(entries) >= MAX_LISTED_ENTRIES:
                    return

    walk(path, 1)
    return entries


class FileAccess(abc.ABC):
    """The file operations text_editor needs, each typed; subclasses say where they run."""

    @abc.abstractmethod
    async def _run(self, operation: Callable[..., Any], path: str, **args: Any) -> Any:
        """`operation(path=path, **args)` somewhere safe; its result or its ToolError."""

    async def kind(self, path: str) -> str:
        result: str = await self._run(kind, path)
        return result

    async def read_text(self, path: str, max_bytes: int) -> str:
        result: str = await self._run(read_text, path, max_bytes=max_bytes)
        return result

    async def write_text(self, path: str, text: str, create_only: bool = False) -> None:
        await self._run(write_text, path, text=text, create_only=create_only)

    async def remove(self, path: str) -> None:
        await self._run(remove, path)

    async def list_tree(self, path: str) -> list[str]:
        result: list[str] = await self._run(list_tree, path)
        return result


class _FileWorkers:
    """At most FILE_WORKERS file operations at once, each in a daemon thread and awaited
    for FILE_OP_TIMEOUT at most.

    Not the loop's default executor: a thread stuck in the kernel (a hung network file
    system) would hold one of its few workers for good, and the server's shutdown waits
    for every executor thread. A stuck daemon thread keeps only its own slot, and a
    full set of stuck ones gives a clear error instead of a queue that never moves.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    async def run(self, function: Any, what: object, /, **args: Any) -> Any:
        if not self._free.acquire(blocking=False):
            raise ToolError(
                f"all {self.size} file workers are busy with operations that do not finish "
                "(a stuck file system?); try again later"
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(outcome: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(outcome)

        def work() -> None:
            try:
                outcome, error = function(**args), None
            except BaseException as exc:  # delivered to the awaiting coroutine
                outcome, error = None, exc
            finally:
                self._free.release()
            with contextlib.suppress(RuntimeError):  # the loop may be gone
                loop.call_soon_threadsafe(settle, outcome, error)

        threading.Thread(target=work, daemon=True, name="file-op").start()
        try:
            return await asyncio.wait_for(future, FILE_OP_TIMEOUT)
        except asyncio.TimeoutError:
            raise ToolError(
                f"the file operation on {what} did not finish within {FILE_OP_TIMEOUT:g} s "
                "(a stuck file system?)"
            ) from None


FILE_WORKERS = _FileWorkers(8)


class DirectFileAccess(FileAccess):
    """Operations as the server's own user, off the event loop, bounded in number and time."""

    async def _run(self, operation: Callable[..., Any], path: str, **args: Any) -> Any:
        return await FILE_WORKERS.run(operation, path, path=path, **args)


class UserFileAccess(FileAccess):
    """Operations as another user, in a forked child that switches to that identity first.

    A fork, not a new program: the runtime may be installed where only its own user can
    reach it (inspect_ai's tools directory is root's, mode 0700), and the child needs
    nothing but the code already in memory. It drops privileges before its first system
    call on the path, so the kernel decides what that user may read or write.
    """

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    async def _run(self, operation: Callable[..., Any], path: str, **args: Any) -> Any:
        args = {"path": path, **args}
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            raise ToolError(
                f"cannot start a file operation as {self.identity.describe()}: {exc}"
            ) from None
        if pid == 0:  # the child: never returns
            os.close(read_end)
            _serve_in_child(self.identity, operation, args, write_end)
        os.close(write_end)
        try:
            data = await asyncio.wait_for(_read_all(read_end), FILE_OP_TIMEOUT)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise ToolError(
                f"the file operation on {args.get('path')} as {self.identity.describe()} did "
                f"not finish within {FILE_OP_TIMEOUT:g} s and was stopped"
            ) from None
        finally:
            await _reap(pid)
        try:
            reply = json.loads(data)
        except ValueError:
            raise ToolError(
                f"the file operation as {self.identity.describe()} ended without an answer"
            ) from None
        if "error" in reply:
            raise ToolError(reply["error"])
        return reply["result"]


def _serve_in_child(identity: Identity, operation: Any, args: dict[str, Any], out: int) -> None:
    try:
        # Nothing the parent's event loop installed may act here: a signal would otherwise
        # be reported to the parent's loop through its wake-up pipe.
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        try:
            become(identity)
            os.chdir("/")
            reply: dict[str, Any] = {"result": operation(**args)}
        except ToolError as exc:
            reply = {"error": exc.message}
        except OSError as exc:
            reply = {"error": f"cannot act as {identity.describe()}: {exc.strerror or exc}"}
        except BaseException as exc:  # the child must always answer, then exit
            reply = {"error": f"the file operation failed: {type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]
    finally:
        os._exit(0)


async def _read_all(fd: int) -> bytes:
    """Everything the child writes until it exits, without blocking the event loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError as exc:
            chunk = b""
            if not done.done():
                done.set_exception(exc)
        if chunk:
            chunks.append(chunk)
        elif not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return b"".join(chunks)


async def _reap(pid: int) -> None:
    """Collect the child so it does not linger as a zombie (it exits right after answering)."""
    for _ in range(500):
        try:
            finished, _status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - never blocks
        except ChildProcessError:
            return
        if finished:
            return
        await asyncio.sleep(0.01)
