"""The file operations text_editor needs, with every failure turned into a ToolError.

Paths are only ever passed to system calls: never to a shell, never into a command
string. `UserFileAccess` performs the same operations as another user by running
`<runtime> file-op` under that uid/gid with the request as JSON on stdin, so the
kernel checks the permissions, not us.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import sys
from typing import Any, Protocol

from sandbox_tools.runtime.child_env import Identity
from sandbox_tools.runtime.jsonrpc import ToolError

MAX_LISTED_ENTRIES = 1000


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


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise _fail(path, exc) from None
    if b"\x00" in data:
        raise ToolError(f"{path} is a binary file; text_editor only edits UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(
            f"{path} is not UTF-8 text (a binary file?); text_editor only edits UTF-8 text"
        ) from None


def write_text(path: str, text: str, create_only: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if create_only else os.O_TRUNC)
    try:
        parent = os.path.dirname(path)
        if create_only and parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, flags | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
    except FileExistsError:
        raise ToolError(
            f"file already exists at {path}; `create` never overwrites: use str_replace or "
            "insert to change it"
        ) from None
    except OSError as exc:
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


OPERATIONS: dict[str, Any] = {
    "kind": kind,
    "read_text": read_text,
    "write_text": write_text,
    "remove": remove,
    "list_tree": list_tree,
}


class FileAccess(Protocol):
    async def call(self, op: str, **args: Any) -> Any: ...


class DirectFileAccess:
    """Operations as the server's own user, off the event loop."""

    async def call(self, op: str, **args: Any) -> Any:
        return await asyncio.to_thread(OPERATIONS[op], **args)


class UserFileAccess:
    """Operations as another user, in a child process running under that identity."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    async def call(self, op: str, **args: Any) -> Any:
        from sandbox_tools.runtime.client import self_command

        command = self_command()
        try:
            process = await self._spawn(command)
        except OSError as exc:
            raise ToolError(
                f"cannot run the runtime as user {self.identity.name} to edit files: "
                f"{exc.strerror or exc} ({command[0]}); the runtime must be readable and "
                "executable by that user"
            ) from None
        request = json.dumps({"op": op, "args": args}).encode()
        stdout, stderr = await process.communicate(request)
        try:
            reply = json.loads(stdout)
        except ValueError:
            raise ToolError(
                f"file operation as {self.identity.name} failed: "
                f"{stderr.decode(errors='replace')[-500:]}"
            ) from None
        if "error" in reply:
            raise ToolError(reply["error"])
        return reply["result"]

    async def _spawn(self, command: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *command,
            "file-op",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            user=self.identity.uid,
            group=self.identity.gid,
            extra_groups=self.identity.groups,
            cwd="/",
        )


def serve_one_request() -> int:
    """`<runtime> file-op`: one operation from stdin, its result as JSON on stdout."""
    try:
        request = json.loads(sys.stdin.buffer.read())
        operation = OPERATIONS[request["op"]]
        reply: dict[str, Any] = {"result": operation(**request["args"])}
    except ToolError as exc:
        reply = {"error": exc.message}
    except (ValueError, KeyError, TypeError) as exc:
        reply = {"error": f"malformed file operation request: {exc}"}
    sys.stdout.write(json.dumps(reply))
    return 0
