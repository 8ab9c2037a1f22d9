"""A Docker container as a sandbox (the provider; containers' lifecycle is containers.py).

Execs and file copies go through `docker_api` (asyncio, no thread per call); the docker
SDK is used only off the hot path (looking the container up, its image's architecture).
Every wait on the engine has a deadline there (THREAT_MODEL.md, rule 3); an exec's
`timeout` covers all of it, the wait for an engine slot included.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import posixpath
import tarfile
import time
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
from docker import DockerClient
from docker.models.containers import Container

from sandbox_tools.errors import ConfigurationError, SandboxExecError
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_OUTPUT_LIMIT,
    DEFAULT_EXEC_TIMEOUT,
    ChunkedLineStream,
    ExecOutput,
    OutputBudget,
    Sandbox,
    Stream,
    StreamLineTooLong,
    as_bytes,
)
from sandbox_tools.sandboxes.docker_api import (
    STDOUT,
    EngineRequestError,
    EngineTimeoutError,
    ExecConnection,
    FrameTooLarge,
    engine_api,
)
from sandbox_tools.sandboxes.engines import docker_client

_STDERR_KEPT = 65536  # a stream's stderr is kept for diagnostics only: its newest bytes
MAX_READ_FILE = 256 * 1024 * 1024  # a file read out of a sandbox (THREAT_MODEL.md, rule 3)
MAX_SYMLINKS = 40  # links followed by one read_file, as Linux does before ELOOP
GO_MODE_DIR = 1 << 31  # Go's os.ModeDir, in the engine's stat of a path


class _MissingDirectory(Exception):
    """The directory an archive was to be extracted into does not exist."""


def _tar_parts(entries: list[tuple[tarfile.TarInfo, bytes]]) -> list[bytes]:
    """A tar archive as a list of parts: file contents are referenced, never copied."""
    parts: list[bytes] = []
    for info, data in entries:
        info.size = len(data) if info.isreg() else 0
        parts.append(info.tobuf(format=tarfile.GNU_FORMAT))
        if info.isreg():
            parts += [data, b"\0" * (-len(data) % tarfile.BLOCKSIZE)]
    parts.append(b"\0" * (2 * tarfile.BLOCKSIZE))  # the end-of-archive marker
    return parts


def _archived_file(data: bytes, path: str) -> tuple[bytes, str | None]:
    """(content, None) of the one file in an engine's archive of `path`, or (b"", target)
    when it is a symbolic link. Anything malformed is a SandboxExecError.

    Plain tar only ("r:"): a compressed archive could expand past MAX_READ_FILE.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            member = tar.next()
            if member is not None and member.issym():
                return b"", member.linkname
            if member is None or member.islnk():  # a lone hard link has nothing to point at
                raise tarfile.ReadError("no file in the archive")
            extracted = tar.extractfile(member)
            if extracted is None:
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            return extracted.read(), None
    except (tarfile.TarError, ValueError, EOFError) as exc:
        raise SandboxExecError(f"the engine sent a malformed archive of {path}: {exc}") from None


class DockerSandbox(Sandbox):
    def __init__(self, container: Container | str, client: DockerClient | None = None) -> None:
        self.client = client or docker_client()
        if isinstance(container, str):
            try:
                container = self.client.containers.get(container)
            except docker.errors.NotFound:
                raise ConfigurationError(
                    f"no container {container!r} on the Docker engine",
                    remedy="Check the name or id with `docker ps -a`.",
                ) from None
        self.container = container
        self.container_id = str(container.id)
        self.name = f"docker:{self.container.name}"
        self._api = engine_api(self.client)

    @property
    def bytes_are_cheap(self) -> bool:
        return self._api.on_this_host

    def mounted_read_only(self, target: str) -> bool:
        # The engine's description of the container, as made (mounts never change).
        mounts = (
            self.container.attrs.get("Mounts") if isinstance(self.container.attrs, dict) else None
        )
        return any(
            isinstance(mount, dict)
            and mount.get("Type") == "bind"
            and mount.get("Destination") == target
            and mount.get("RW") is False
            for mount in (mounts if isinstance(mounts, list) else [])
        )

    # -- exec ----------------------------------------------------------------------------

    async def _start_exec(
        self,
        cmd: list[str],
        stdin: bool,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
    ) -> tuple[str, ExecConnection]:
        try:
            exec_id = await self._api.exec_create(self.container_id, cmd, stdin, cwd, env, user)
            return exec_id, await self._api.exec_start(exec_id)
        except EngineRequestError as exc:
            raise SandboxExecError(f"cannot exec in {self.name}: {exc}") from None

    async def _run(
        self,
        cmd: list[str],
        data: bytes | memoryview | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
        budget: OutputBudget,
    ) -> ExecOutput:
        async with self._api.slot():
            return await self._run_in_slot(cmd, data, cwd, env, user, budget)

    async def _run_in_slot(
        self,
        cmd: list[str],
        data: bytes | memoryview | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
        budget: OutputBudget,
    ) -> ExecOutput:
        exec_id, conn = await self._start_exec(cmd, data is not None, cwd, env, user)
        out, err = bytearray(), bytearray()
        feeder = asyncio.create_task(self._feed(conn, data)) if data is not None else None
        try:
            while True:
                try:
                    frame = await conn.next_frame(budget.limit - budget.used)
                except FrameTooLarge as too_large:
                    budget.take(too_large.args[0])  # raises: over the cap
                    raise
                if frame is None:
                    break
                budget.take(len(frame[1]))
                (out if frame[0] == STDOUT else err).extend(frame[1])
        finally:
            conn.close()
            if feeder is not None:
                feeder.cancel()
                # Not `await feeder` under suppress(CancelledError): that would also swallow
                # the cancellation of this exec by its deadline, and carry on past it.
                await asyncio.wait({feeder})
                if not feeder.cancelled():
                    feeder.result()  # what _feed does not expect, it does not hide
        return ExecOutput(await self._api.exit_code(exec_id), bytes(out), bytes(err))

    @staticmethod
    async def _feed(conn: ExecConnection, data: bytes | memoryview) -> None:
        # Concurrent with reading: a process that prints while it reads would otherwise
        # fill its pipe and wait for us while we wait for it.
        try:
            await conn.send(data)
        except (OSError, RuntimeError):
            pass
        finally:
            await conn.close_input()

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
        budget = OutputBudget(max_output, f"{cmd[0]} in {self.name}")
        try:
            # The wait for an engine slot counts: with every slot held by execs on a hung
            # engine, exec(timeout=2) returned after 29 s.
            return await asyncio.wait_for(
                self._run(cmd, as_bytes(input), cwd, env, user, budget), timeout
            )
        except EngineTimeoutError:
            raise  # a deadline of the engine's, shorter than ours: already a TimeoutError
        except asyncio.TimeoutError:  # not the builtin one before 3.11
            raise TimeoutError(f"{cmd[0]} did not finish within {timeout}s") from None

    # -- files ---------------------------------------------------------------------------

    def _read_only_root(self) -> bool:
        """Whether the container's root is read-only, from the engine's (checked) answer."""
        attrs: Any = self.container.attrs
        host_config = (attrs.get("HostConfig") if isinstance(attrs, dict) else None) or {}
        read_only = host_config.get("ReadonlyRootfs") if isinstance(host_config, dict) else ""
        if not isinstance(read_only, (bool, type(None))):
            raise SandboxExecError(
                f"the engine's description of {self.name} is malformed: "
                f"HostConfig {host_config!r:.80}"
            )
        return bool(read_only)

    async def _upload(self, directory: str, archive: list[bytes], verb: str, path: str) -> None:
        """Extract `archive` into `directory`; any refusal becomes a SandboxExecError."""
        if self._read_only_root():
            # The engine refuses archives into such a container even onto a writable
            # tmpfs, but only after receiving the whole body (half a second for 9 MB):
            # refuse at once, so callers stream through exec instead.
            raise SandboxExecError(
                f"cannot {verb} {path} in {self.name}: container rootfs is marked read-only "
                "(the engine takes no file uploads into it; write through exec)"
            )
        try:
            async with self._api.slot():
                await self._api.put_archive(self.container_id, directory, archive)
        except EngineRequestError as exc:
            if exc.status == 404:
                raise _MissingDirectory(directory) from None
            raise SandboxExecError(f"cannot {verb} {path} in {self.name}: {exc}") from None

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        directory, _, name = path.rpartition("/")
        while True:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, int(time.time())
            try:
                await self._upload(directory, _tar_parts([(info, data)]), "write", path)
                return
            except _MissingDirectory:
                # Extract from the nearest existing ancestor: the engine creates the
                # missing directories on the way and leaves existing ones as they are.
                if directory in ("", "/"):
                    raise FileNotFoundError(path) from None
                directory, _, missing = directory.rpartition("/")
                name = f"{missing}/{name}"

    async def write_new_directory(self, path: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        parent, _, name = path.rstrip("/").rpartition("/")
        directory = tarfile.TarInfo(name)
        directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, 0o755, 0
        entries = [(directory, b"")]
        for file_name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(f"{name}/{file_name}")
            info.mode, info.mtime = mode, 0
            entries.append((info, data))
        try:
            await self._upload(parent, _tar_parts(entries), "create", path)
        except _MissingDirectory:
            raise SandboxExecError(
                f"cannot create {path} in {self.name}: {parent} is missing"
            ) from None

    async def read_file(self, path: str) -> bytes:
        """The file's bytes; symbolic links are followed, in the container, as open() does.

        The engine archives a link itself, not its target (reading one raised KeyError).
        """
        wanted = path
        for _ in range(MAX_SYMLINKS + 1):
            try:
                async with self._api.slot():
                    data = await self._api.get_archive(self.container_id, wanted, MAX_READ_FILE)
            except EngineRequestError as exc:
                if exc.status == 404:
                    raise FileNotFoundError(path) from None
                raise SandboxExecError(f"cannot read {path} in {self.name}: {exc}") from None
            content, link = _archived_file(data, path)
            if link is None:
                return content
            wanted = posixpath.join(posixpath.dirname(wanted), link)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    async def exists(self, path: str) -> bool:
        """Whether `path` is there (a link counts, whatever it points at), by the engine's
        stat: nothing in the container runs. One small request within the control
        deadline, taking no exec slot (those bound execs and archives, which can be long)."""
        return await self._api.path_mode(self.container_id, path) is not None

    async def is_directory(self, path: str) -> bool:
        """Whether `path` is a directory, by the engine's stat (nothing in the container
        runs): the engine's archive upload replaces a directory by a file of its name."""
        mode = await self._api.path_mode(self.container_id, path)
        return mode is not None and bool(mode & GO_MODE_DIR)

    async def architecture_hint(self) -> str | None:
        def image_arch() -> str | None:
            attrs: Any = self.container.attrs
            image_id = attrs.get("Image") if isinstance(attrs, dict) else None
            if not isinstance(image_id, str):
                raise SandboxExecError(f"the engine names no image for {self.name}")
            low: Any = self.client.api  # the SDK's low-level client: its raw JSON, no model
            image = low.inspect_image(image_id)
            arch = image.get("Architecture") if isinstance(image, dict) else 0
            if not isinstance(arch, (str, type(None))):
                raise SandboxExecError(
                    f"the engine's image {image_id[:80]} has a malformed Architecture"
                )
            return arch or None

        return await self._api.sdk_call("describe the image", image_arch)

    # -- persistent stream ---------------------------------------------------------------

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        # Only the start holds an exec slot: a stream lives as long as its sandbox.
        async with self._api.slot():
            _, conn = await self._start_exec(cmd, True, None, env, user)
        return _DockerStream(conn)


class _DockerStream(ChunkedLineStream):
    """Lines of the exec's stdout; stderr frames are kept for diagnostics only."""

    def __init__(self, conn: ExecConnection) -> None:
        super().__init__()
        self._conn = conn
        self._write_lock = asyncio.Lock()
        self.stderr = bytearray()

    async def write(self, data: bytes) -> None:
        async with self._write_lock:
            await self._conn.send(data)

    async def _next_chunk(self, max_payload: int) -> bytes | None:
        try:
            frame = await self._conn.next_frame(max_payload)
        except FrameTooLarge:
            raise StreamLineTooLong(
                f"the stream sent more than {max_payload} bytes without a newline"
            ) from None
        if frame is None:
            return None
        if frame[0] == STDOUT:
            return frame[1]
        self.stderr += frame[1][-_STDERR_KEPT:]
        del self.stderr[:-_STDERR_KEPT]
        return b""

    async def close(self) -> None:
        await self._conn.close_input()
        self._conn.close()
