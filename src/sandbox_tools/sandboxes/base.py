"""The interface every sandbox provider implements.

Kept deliberately small so that adding a provider (Podman, Modal, ...) is one new
module: run a command, move a file in and out, optionally hold a stream open.
"""

from __future__ import annotations

import abc
import errno
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox_tools.errors import SandboxExecError, SandboxOutputLimitError

# Bounds on what the host accepts from a sandbox (THREAT_MODEL.md, rule 3). Every exec
# is bounded in bytes and, unless the caller says otherwise, in time: an image whose
# shell prints forever or never exits costs the host at most this much.
DEFAULT_EXEC_OUTPUT_LIMIT = 64 * 1024 * 1024  # stdout + stderr of one exec
DEFAULT_EXEC_TIMEOUT = 600.0
# What `sh`, coreutils and busybox print (the C library's strerror, the same wording in
# glibc and musl) when a file operation fails in a sandbox, and the OSError each means.
_FILE_ERRORS: tuple[tuple[str, type[OSError], int], ...] = (
    ("Permission denied", PermissionError, errno.EACCES),
    ("Read-only file system", PermissionError, errno.EROFS),
    ("No such file or directory", FileNotFoundError, errno.ENOENT),
    ("Not a directory", NotADirectoryError, errno.ENOTDIR),
    ("Is a directory", IsADirectoryError, errno.EISDIR),
)


def file_error_kind(said: str) -> tuple[type[OSError], int] | None:
    """The OSError class and errno that a failed file command's message names, if any."""
    return next(((kind, code) for phrase, kind, code in _FILE_ERRORS if phrase in said), None)


# The longest line a persistent stream may carry: one JSON-RPC frame plus slack.
MAX_STREAM_LINE = 64 * 1024 * 1024 + 4096


@dataclass(frozen=True)
class ExecOutput:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def success(self) -> bool:
        return self.returncode == 0


class Stream(abc.ABC):
    """A long-lived process's stdin/stdout (the runtime's `stdio` channel)."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def readline(self, limit: int = MAX_STREAM_LINE) -> bytes:
        """The next line including its newline; b"" once the process's stdout is closed.

        Raises StreamLineTooLong past `limit` bytes without a newline (never more than
        MAX_STREAM_LINE; a caller expecting short lines, as the probe's, asks for less, so
        a sandbox cannot make the host hold megabytes first): the stream is then unusable
        and must be closed.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close stdin and release the stream; the process ends when it sees EOF."""


class Sandbox(abc.ABC):
    """One running sandbox (a container, a VM, this machine)."""

    name: str

    @abc.abstractmethod
    async def exec(
        self,
        cmd: list[str],
        input: bytes | memoryview | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = DEFAULT_EXEC_OUTPUT_LIMIT,
    ) -> ExecOutput:
        """Run `cmd` (no shell) to completion.

        Raises TimeoutError past `timeout` seconds (None: the caller bounds it) and
        SandboxOutputLimitError, with the exec closed, once stdout and stderr together
        exceed `max_output` bytes.
        """

    def exec_output_limit(self) -> int | None:
        """The most one exec may print before the provider refuses it, where that is lower
        than what callers ask of `exec` (inspect's sandboxes: the task's limit); None:
        the caller's `max_output` holds."""
        return None

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes: ...

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream | None:
        """Start `cmd` with stdin/stdout held open, or None if this provider cannot."""
        return None

    async def write_new_directory(self, path: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        """Create directory `path` holding `files` (name -> (bytes, mode)) without a shell.

        Needed where the sandbox has no shell to run `mkdir` with (distroless images).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot create directories by upload")

    async def architecture_hint(self) -> str | None:
        """The sandbox's CPU architecture as the provider knows it (no exec needed)."""
        return None

    def mounted_read_only(self, target: str) -> bool:
        """Whether the provider made this sandbox with a host directory mounted read-only
        at `target` (an add-on's checked tree: browser_mount). What the engine says, not
        what the sandbox says; the runtime checks the mount again before using it."""
        return False

    @property
    def bytes_are_cheap(self) -> bool:
        """Whether sending a byte into the sandbox costs less than decompressing it there
        (an engine on this host): add-ons then travel as plain tar, since xz's one-core
        decompression in the sandbox was most of a browser's first call. False where
        the provider cannot tell (a remote engine, a service, inspect's providers)."""
        return False

    async def cleanup(self) -> None:
        """Release what the provider holds for this sandbox (not the sandbox itself)."""


class StreamLineTooLong(SandboxExecError):
    """A persistent stream sent more than MAX_STREAM_LINE bytes without a newline."""


class OutputBudget:
    """Counts an exec's output against its cap; providers call `take` per chunk."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.used = 0

    def take(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise SandboxOutputLimitError(
                f"{self.what} printed more than {self.limit} bytes; the exec was closed"
            )


class LineSplitter:
    """Bytes in, complete lines out; scans each byte once and caps a line's length.

    Rescanning the whole buffer for every frame made a line without newlines cost
    quadratic time; an uncapped buffer let a sandbox grow the host without limit.
    """

    def __init__(self, max_line: int = MAX_STREAM_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._scanned = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_line(self, limit: int | None = None) -> bytes | None:
        """A complete line (with its newline), or None until more bytes arrive; `limit`
        lowers `max_line` for this line."""
        end = self._buffer.find(b"\n", self._scanned)
        bound = self.max_line if limit is None else min(limit, self.max_line)
        if end < 0:
            self._scanned = len(self._buffer)
            if self._scanned > bound:
                raise StreamLineTooLong(
                    f"the stream sent more than {bound} bytes without a newline"
                )
            return None
        if end > bound:
            raise StreamLineTooLong(f"the stream sent a line of more than {bound} bytes")
        line = bytes(self._buffer[: end + 1])
        del self._buffer[: end + 1]
        self._scanned = 0
        return line

    def rest(self) -> bytes:
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._scanned = 0
        return rest


class ChunkedLineStream(Stream):
    """A stream whose provider delivers stdout in chunks: lines cut by one LineSplitter."""

    def __init__(self) -> None:
        self._lines = LineSplitter()
        self._eof = False

    @abc.abstractmethod
    async def _next_chunk(self, max_payload: int) -> bytes | None:
        """The next stdout bytes (b"" for a chunk of something else), None at the end;
        where the provider can tell before reading, StreamLineTooLong for a chunk over
        `max_payload`."""

    async def readline(self, limit: int = MAX_STREAM_LINE) -> bytes:
        while True:
            line = self._lines.next_line(limit)
            if line is not None:
                return line
            if self._eof:
                rest = self._lines.rest()
                if len(rest) > limit:
                    raise StreamLineTooLong(f"the stream sent a line of more than {limit} bytes")
                return rest
            chunk = await self._next_chunk(min(limit, self._lines.max_line))
            if chunk is None:
                self._eof = True
            else:
                self._lines.feed(chunk)


def as_user(cmd: list[str], user: str | None) -> list[str]:
    """`cmd` run as `user`, for providers whose exec has no user of its own."""
    return ["runuser", "-u", user, "--", *cmd] if user is not None else list(cmd)


def as_bytes(data: bytes | memoryview | str | None) -> bytes | memoryview | None:
    """Text is sent as UTF-8; bytes (or a view of them) as they are."""
    return data.encode() if isinstance(data, str) else data
