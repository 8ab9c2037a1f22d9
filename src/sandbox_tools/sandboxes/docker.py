"""A Docker container as a sandbox, through the docker SDK.

The SDK is synchronous; every engine call runs in a worker thread. Exec uses the
engine's hijacked exec socket directly (the SDK's `exec_run` cannot send stdin):
stdout/stderr arrive multiplexed in frames of an 8-byte header (stream id, 3 zero
bytes, big-endian length) followed by the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from sandbox_tools.errors import ConfigurationError, EngineUnavailableError, SandboxExecError
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

T = TypeVar("T")
_HEADER = struct.Struct(">BxxxL")
_STDOUT, _STDERR = 1, 2
_MAX_FRAME = 1 << 32
_STDERR_KEPT = 65536  # a stream's stderr is kept for diagnostics only: its newest bytes


def _in_daemon_thread(function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run blocking socket I/O in a daemon thread, not the loop's executor.

    A read that never returns (an exec whose other end stays open) must not hold up
    the event loop's shutdown, which waits for every executor thread.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def deliver(outcome: Callable[[], None]) -> None:
        # The caller may have given up and its loop closed (a timed-out read that the
        # socket's shutdown woke): nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome)

    def run() -> None:
        try:
            result = function(*args)
        except BaseException as exc:
            error = exc
            deliver(lambda: future.set_exception(error))
        else:
            deliver(lambda: future.set_result(result))

    threading.Thread(target=run, daemon=True, name="docker-socket").start()
    return future


def docker_client() -> Any:
    """A client for the engine named by the environment (DOCKER_HOST, default socket)."""
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineUnavailableError(f"no Docker engine answers: {exc}") from None
    return client


class _FrameTooLarge(Exception):
    """A frame larger than the reader may still accept; `args[0]` is its size."""


class _ExecSocket:
    """The raw, blocking exec connection with frame demultiplexing."""

    def __init__(self, raw: Any) -> None:
        self._owner = raw  # keeps the HTTP response (and so the socket) alive
        self.sock: socket.socket = getattr(raw, "_sock", raw)
        self._buffer = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close_input(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _fill(self, count: int) -> bool:
        while len(self._buffer) < count:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return False
            self._buffer += chunk
        return True

    def next_frame(self, max_payload: int = _MAX_FRAME) -> tuple[int, bytes] | None:
        """The next (stream, payload); a payload over `max_payload` is refused unread."""
        if not self._fill(_HEADER.size):
            return None
        stream, length = _HEADER.unpack_from(self._buffer)
        if length > max_payload:
            # Checked before buffering it: the header alone may announce 4 GiB.
            raise _FrameTooLarge(length)
        if not self._fill(_HEADER.size + length):
            return None
        payload = bytes(self._buffer[_HEADER.size : _HEADER.size + length])
        del self._buffer[: _HEADER.size + length]
        return stream, payload

    def close(self) -> None:
        # shutdown() wakes a thread blocked in recv() on this socket; close() alone does not,
        # and the event loop's executor would wait for that thread forever.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        try:
            self.sock.close()
        finally:
            close = getattr(self._owner, "close", None)
            if close is not None:
                close()


class _MissingDirectory(Exception):
    """The directory an archive was to be extracted into does not exist."""


class DockerSandbox(Sandbox):
    def __init__(self, container: Any, client: Any | None = None) -> None:
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
        self.name = f"docker:{self.container.name}"

    # -- exec ----------------------------------------------------------------------------

    def _start_exec(
        self,
        cmd: list[str],
        stdin: bool,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
    ) -> tuple[str, _ExecSocket]:
        try:
            created = self.client.api.exec_create(
                self.container.id,
                cmd,
                stdin=stdin,
                stdout=True,
                stderr=True,
                environment=dict(env) if env else None,
                workdir=cwd,
                user=user or "",
            )
            raw = self.client.api.exec_start(created["Id"], socket=True)
        except docker.errors.APIError as exc:
            raise SandboxExecError(
                f"cannot exec in {self.name}: {exc.explanation or exc}"
            ) from None
        return created["Id"], _ExecSocket(raw)

    def _exit_code(self, exec_id: str) -> int:
        # The exit code can lag the stream's end by a moment.
        for _ in range(200):
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.005)
        raise SandboxExecError(f"exec {exec_id[:12]} in {self.name} did not report an exit code")

    def _exec_blocking(
        self,
        cmd: list[str],
        data: bytes | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
        opened: list[_ExecSocket],
        budget: OutputBudget,
    ) -> ExecOutput:
        exec_id, conn = self._start_exec(cmd, data is not None, cwd, env, user)
        opened.append(conn)  # lets a timed-out caller close it and wake this thread
        out, err = bytearray(), bytearray()
        try:
            if data is not None:
                writer = threading.Thread(target=self._feed, args=(conn, data), daemon=True)
                writer.start()
            while True:
                try:
                    frame = conn.next_frame(budget.limit - budget.used)
                except _FrameTooLarge as too_large:
                    budget.take(too_large.args[0])  # raises: over the cap
                    raise
                if frame is None:
                    break
                budget.take(len(frame[1]))
                (out if frame[0] == _STDOUT else err).extend(frame[1])
        finally:
            conn.close()
        return ExecOutput(self._exit_code(exec_id), bytes(out), bytes(err))

    @staticmethod
    def _feed(conn: _ExecSocket, data: bytes) -> None:
        try:
            conn.send(data)
        except OSError:
            pass
        finally:
            conn.close_input()

    async def exec(
        self,
        cmd: list[str],
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = DEFAULT_EXEC_OUTPUT_LIMIT,
    ) -> ExecOutput:
        opened: list[_ExecSocket] = []
        budget = OutputBudget(max_output, f"{cmd[0]} in {self.name}")
        task = _in_daemon_thread(
            self._exec_blocking, cmd, as_bytes(input), cwd, env, user, opened, budget
        )
        try:
            return await asyncio.wait_for(task, timeout)
        except BaseException as exc:
            for conn in opened:
                conn.close()
            if isinstance(exc, asyncio.TimeoutError):  # not the builtin one before 3.11
                raise TimeoutError(f"{cmd[0]} did not finish within {timeout}s") from None
            raise

    # -- files ---------------------------------------------------------------------------

    def _read_only_root(self) -> bool:
        host_config = self.container.attrs.get("HostConfig") or {}
        return bool(host_config.get("ReadonlyRootfs"))

    def _upload(self, directory: str, archive: io.BytesIO, verb: str, path: str) -> None:
        """Extract `archive` into `directory`; any refusal becomes a SandboxExecError."""
        if self._read_only_root():
            # The engine refuses archives into such a container even onto a writable
            # tmpfs, but only after receiving the whole body (half a second for 9 MB):
            # refuse at once, so callers stream through exec instead (issue 16).
            raise SandboxExecError(
                f"cannot {verb} {path} in {self.name}: container rootfs is marked read-only "
                "(the engine takes no file uploads into it; write through exec)"
            )
        try:
            ok = self.container.put_archive(directory or "/", archive.getvalue())
        except docker.errors.NotFound:
            raise _MissingDirectory(directory) from None
        except docker.errors.APIError as exc:
            raise SandboxExecError(
                f"cannot {verb} {path} in {self.name}: {exc.explanation or exc}"
            ) from None
        if not ok:
            raise SandboxExecError(f"the engine refused to {verb} {path} in {self.name}")

    def _put(self, path: str, data: bytes, mode: int) -> None:
        directory, _, name = path.rpartition("/")
        while True:
            archive = io.BytesIO()
            with tarfile.open(fileobj=archive, mode="w") as tar:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = mode
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(data))
            try:
                self._upload(directory, archive, "write", path)
                return
            except _MissingDirectory:
                # Extract from the nearest existing ancestor: the engine creates the
                # missing directories on the way and leaves existing ones as they are.
                if directory in ("", "/"):
                    raise FileNotFoundError(path) from None
                directory, _, missing = directory.rpartition("/")
                name = f"{missing}/{name}"

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await asyncio.to_thread(self._put, path, data, mode)

    def _put_directory(self, path: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        parent, _, name = path.rstrip("/").rpartition("/")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            directory = tarfile.TarInfo(name)
            directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(directory)
            for file_name, (data, mode) in sorted(files.items()):
                info = tarfile.TarInfo(f"{name}/{file_name}")
                info.size, info.mode, info.mtime = len(data), mode, 0
                tar.addfile(info, io.BytesIO(data))
        try:
            self._upload(parent, archive, "create", path)
        except _MissingDirectory:
            raise SandboxExecError(
                f"cannot create {path} in {self.name}: {parent} is missing"
            ) from None

    async def write_new_directory(self, path: str, files: Mapping[str, tuple[bytes, int]]) -> None:
        await asyncio.to_thread(self._put_directory, path, files)

    def _get(self, path: str) -> bytes:
        try:
            chunks, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            raise FileNotFoundError(path) from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            extracted = tar.extractfile(member) if member is not None else None
            if extracted is None:
                raise IsADirectoryError(path)
            return extracted.read()

    async def read_file(self, path: str) -> bytes:
        return await asyncio.to_thread(self._get, path)

    async def architecture_hint(self) -> str | None:
        def image_arch() -> str | None:
            image = self.client.images.get(self.container.attrs["Image"])
            return str(image.attrs.get("Architecture") or "") or None

        return await asyncio.to_thread(image_arch)

    # -- persistent stream ---------------------------------------------------------------

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        _, conn = await asyncio.to_thread(self._start_exec, cmd, True, None, env, user)
        return _DockerStream(conn)


class _DockerStream(ChunkedLineStream):
    """Lines of the exec's stdout; stderr frames are kept for diagnostics only."""

    def __init__(self, conn: _ExecSocket) -> None:
        super().__init__()
        self._conn = conn
        self._write_lock = asyncio.Lock()
        self.stderr = bytearray()

    async def write(self, data: bytes) -> None:
        async with self._write_lock:
            await _in_daemon_thread(self._conn.send, data)

    async def _next_chunk(self) -> bytes | None:
        try:
            frame = await _in_daemon_thread(self._conn.next_frame, self._lines.max_line)
        except _FrameTooLarge:
            raise StreamLineTooLong(
                f"the stream sent more than {self._lines.max_line} bytes without a newline"
            ) from None
        if frame is None:
            return None
        if frame[0] == _STDOUT:
            return frame[1]
        self.stderr += frame[1][-_STDERR_KEPT:]
        del self.stderr[:-_STDERR_KEPT]
        return b""

    async def close(self) -> None:
        await asyncio.to_thread(self._conn.close_input)
        await asyncio.to_thread(self._conn.close)


KEEP_CONTAINERS_ENV = "SANDBOX_TOOLS_KEEP_CONTAINERS"


# Containers made by running_container/run_to_completion and not yet removed: a build or
# validate interrupted with Ctrl-C removes them from the main thread, which also ends the
# worker threads waiting on them.
_LIVE: set[Any] = set()
_LIVE_LOCK = threading.Lock()


OWNER_LABEL = "sandbox-tools.owner-pid"


def _owned(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Label a container with the process that made it: what it left behind is findable."""
    labels = dict(kwargs.pop("labels", None) or {})
    labels.setdefault(OWNER_LABEL, str(os.getpid()))
    return {**kwargs, "labels": labels}


def _track(container: Any) -> None:
    with _LIVE_LOCK:
        _LIVE.add(container)


def _untrack(container: Any) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(container)


def remove_live_containers() -> int:
    """Remove every container this process started and still runs; how many."""
    with _LIVE_LOCK:
        live = list(_LIVE)
        _LIVE.clear()
    for container in live:
        with contextlib.suppress(Exception):
            container.remove(force=True)
    return len(live)


@contextlib.contextmanager
def running_container(
    client: Any, image: str, *, command: list[str] | None = None, **kwargs: Any
) -> Iterator[Any]:
    """A container that exists exactly as long as the `with` block.

    Removed on exit even on error or Ctrl-C; set SANDBOX_TOOLS_KEEP_CONTAINERS=1
    to keep it for debugging.
    """
    container = client.containers.run(
        image, command=command or ["sleep", "infinity"], detach=True, **_owned(kwargs)
    )
    _track(container)
    try:
        yield container
    finally:
        _untrack(container)
        if os.environ.get(KEEP_CONTAINERS_ENV) != "1":
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def _archive_of(copy_in: Mapping[str, Path]) -> bytes:
    """One tar, rooted at /, with each host file or tree at its container path."""
    skip = {"__pycache__", ".mypy_cache", ".ruff_cache"}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for target, source in copy_in.items():
            tar.add(
                source,
                arcname=target.strip("/"),
                filter=lambda info: None if skip & set(info.name.split("/")) else info,
            )
    return archive.getvalue()


def _extract_into(chunks: Iterator[bytes], destination: Path) -> None:
    """Unpack a `get_archive` stream of a directory into `destination` (its contents)."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if not inner:
                continue  # the directory itself
            member.name = inner
            members.append(member)
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(destination, members=members, filter="tar")
        else:  # Python before the extraction filters: names were rebased above
            tar.extractall(destination, members=members)


def run_to_completion(
    client: Any,
    image: str,
    command: list[str],
    on_line: Callable[[str], None] = lambda _: None,
    copy_in: Mapping[str, Path] | None = None,
    copy_out: tuple[str, Path] | None = None,
    **kwargs: Any,
) -> tuple[int, str]:
    """Run `command` in a fresh container; stream its output lines; always remove it.

    Files travel by copy (`copy_in` before the start, `copy_out` after the exit), not by
    bind mounts, so the engine may be on another machine.
    """
    container = client.containers.create(image, command=command, **_owned(kwargs))
    _track(container)
    lines: list[str] = []
    try:
        if copy_in:
            container.put_archive("/", _archive_of(copy_in))
        container.start()
        pending = ""
        for chunk in container.logs(stream=True, follow=True):
            pending += chunk.decode(errors="replace")
            *complete, pending = pending.split("\n")
            for line in complete:
                lines.append(line)
                on_line(line)
        if pending:
            lines.append(pending)
            on_line(pending)
        status = container.wait()
        if copy_out is not None:
            chunks, _ = container.get_archive(copy_out[0])
            _extract_into(chunks, copy_out[1])
    finally:
        _untrack(container)
        if os.environ.get(KEEP_CONTAINERS_ENV) != "1":
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
    return int(status.get("StatusCode", 1)), "\n".join(lines)
