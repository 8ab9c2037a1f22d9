"""The interface every sandbox provider implements.

Kept deliberately small so that adding a provider (Podman, Modal, ...) is one new
module: run a command, move a file in and out, optionally hold a stream open.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass


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
    async def readline(self) -> bytes:
        """The next line including its newline; b"" once the process's stdout is closed."""

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
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = None,
    ) -> ExecOutput:
        """Run `cmd` (no shell) to completion; raises TimeoutError past `timeout` seconds."""

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

    async def cleanup(self) -> None:
        """Release what the provider holds for this sandbox (not the sandbox itself)."""


def as_user(cmd: list[str], user: str | None) -> list[str]:
    """`cmd` run as `user`, for providers whose exec has no user of its own."""
    return ["runuser", "-u", user, "--", *cmd] if user is not None else list(cmd)


def as_bytes(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data
