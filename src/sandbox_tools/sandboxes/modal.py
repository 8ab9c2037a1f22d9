"""Modal sandboxes as a provider: one long-lived sandbox per sample, files through exec.

Modal has no archive upload, so files travel as base64 through `exec`: contents go on
stdin in bounded chunks (never in argv, never through a shell's quoting), the path is a
positional parameter of a fixed script, and the file appears by rename only once every
chunk has arrived. Everything that talks to Modal is retried on transient errors with
backoff; everything else here (chunking, paths, error mapping, compose parameters) is
plain code, unit-tested without the SDK. The SDK is an optional extra:
`pip install 'sandbox-tools[modal]'`.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import math
import os
import posixpath
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from sandbox_tools.errors import ConfigurationError, SandboxExecError, SandboxOutputLimitError
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_OUTPUT_LIMIT,
    DEFAULT_EXEC_TIMEOUT,
    ChunkedLineStream,
    ExecOutput,
    OutputBudget,
    Sandbox,
    Stream,
    as_bytes,
    as_user,
    file_error_kind,
)
from sandbox_tools.sandboxes.modal_config import CREDENTIALS_REMEDY, ModalConfig, _sdk

T = TypeVar("T")

CHUNK_BYTES = 1 << 20  # raw bytes per exec; about 1.4 MB of base64 on the wire
LEFTOVER_TAG = "sandbox-tools"  # every sandbox we create carries it (see cleanup_leftovers)

# Fixed scripts; the path is "$1", the data is on stdin. Exit codes name the failure.
_READ_SIZE = (
    'if [ ! -e "$1" ]; then exit 3; fi; if [ -d "$1" ]; then exit 4; fi; '
    'if [ ! -r "$1" ]; then exit 5; fi; wc -c < "$1"'
)
_READ_CHUNK = 'dd if="$1" bs="$2" skip="$3" count=1 2>/dev/null | base64'
_WRITE_BEGIN = (
    'if [ -d "$1" ]; then exit 4; fi; mkdir -p "$(dirname "$1")" && : > "$1.sandbox-tools-partial"'
)
_WRITE_CHUNK = 'base64 -d >> "$1.sandbox-tools-partial"'
_WRITE_COMMIT = 'chmod "$2" "$1.sandbox-tools-partial" && mv -f "$1.sandbox-tools-partial" "$1"'
_WRITE_ABORT = 'rm -f "$1.sandbox-tools-partial"'
_EXIT_ERRORS: dict[int, tuple[type[OSError], int]] = {
    3: (FileNotFoundError, errno.ENOENT),
    4: (IsADirectoryError, errno.EISDIR),
    5: (PermissionError, errno.EACCES),
}


# -- pure parts ---------------------------------------------------------------------------


def resolve_path(path: str, workdir: str) -> str:
    """Relative paths are relative to the sandbox's working directory, like a shell's."""
    if not path:
        raise ValueError("an empty path names no file")
    if "\0" in path:
        raise ValueError("a path cannot contain NUL")
    joined = path if path.startswith("/") else posixpath.join(workdir or "/", path)
    return posixpath.normpath(joined).replace("//", "/")


def base64_chunks(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Each chunk is valid base64 on its own (decoded separately, appended in order)."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    for offset in range(0, len(data), chunk_bytes):
        yield base64.b64encode(data[offset : offset + chunk_bytes]) + b"\n"


def chunk_count(size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(1, math.ceil(size / chunk_bytes))


def os_error_for(path: str, returncode: int, stderr: bytes) -> OSError | None:
    """The provider-interface exception for a failed file script, if it is a known one."""
    if returncode in _EXIT_ERRORS:
        error, code = _EXIT_ERRORS[returncode]
        return error(code, os.strerror(code), path)
    kind = file_error_kind(stderr.decode(errors="replace"))
    return kind[0](kind[1], os.strerror(kind[1]), path) if kind else None


def is_transient(exc: BaseException) -> bool:
    """Worth another try: connection trouble and Modal's retryable server errors."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names
        & {
            "ConnectionError",  # modal.exception.ConnectionError and the builtin
            "InternalError",
            "ServiceError",
            "ResourceExhaustedError",
            "InternalFailure",
            "StreamTerminatedError",
        }
    ) and not isinstance(exc, (PermissionError, FileNotFoundError))


def translate_error(exc: BaseException) -> BaseException:
    """Modal's exceptions as the provider interface's (credentials get a remedy)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    module = type(exc).__module__
    if "AuthError" in names or (
        module.startswith("modal") and "token" in str(exc).lower() and "Error" in names
    ):
        return ConfigurationError(
            f"Modal refused the credentials: {exc}", remedy=CREDENTIALS_REMEDY
        )
    if module.startswith("modal") and "TimeoutError" in names:
        return TimeoutError(str(exc))
    if "NotFoundError" in names and module.startswith("modal"):
        return SandboxExecError(f"Modal: {exc}", remedy="Is the sandbox still running?")
    return exc


async def with_retries(
    call: Callable[[], Awaitable[T]],
    attempts: int = 4,
    backoff: float = 0.5,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`call()` again after a transient failure, waiting backoff * 2^n (+ jitter)."""
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise translate_error(exc) from exc
            await sleep(backoff * (2**attempt) * (1 + random.random() / 4))
    raise AssertionError("unreachable")


# -- the provider -------------------------------------------------------------------------


async def _bounded_read(reader: Any, budget: OutputBudget) -> bytes:
    """A Modal output stream read chunk by chunk, never past the exec's byte budget."""
    collected = bytearray()
    async for chunk in reader:
        block = chunk if isinstance(chunk, bytes) else str(chunk).encode()
        budget.take(len(block))
        collected += block
    return bytes(collected)


class ModalSandbox(Sandbox):
    """A running Modal sandbox; `create()` starts one, `cleanup()` always terminates it."""

    def __init__(self, sandbox: Any, config: ModalConfig) -> None:
        self._sandbox = sandbox
        self.config = config
        self.name = f"modal:{sandbox.object_id}"

    @classmethod
    async def create(cls, config: ModalConfig | None = None) -> ModalSandbox:
        config = config or ModalConfig()
        modal = _sdk()

        async def start() -> Any:
            app = await modal.App.lookup.aio(config.app_name, create_if_missing=True)
            volumes = {
                path: modal.Volume.from_name(name, create_if_missing=True)
                for path, name in config.volumes.items()
            }
            return await modal.Sandbox.create.aio(
                "sleep",
                "infinity",
                app=app,
                image=modal.Image.from_registry(config.image),
                timeout=config.timeout,
                workdir=config.workdir,
                cpu=config.cpu,
                memory=config.memory,
                gpu=config.gpu,
                encrypted_ports=list(config.ports),
                volumes=volumes,
                env=dict(config.env) or None,
                tags={LEFTOVER_TAG: uuid.uuid4().hex},
            )

        return cls(await with_retries(start, config.retries), config)

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
        data = as_bytes(input)
        budget = OutputBudget(max_output, f"{cmd[0]} in {self.name}")
        started = time.monotonic()
        # Only starting the process is retried: once it runs, a retry could run it twice.
        process = await with_retries(
            lambda: self._sandbox.exec.aio(
                *as_user(cmd, user),
                workdir=resolve_path(cwd, self.config.workdir) if cwd else None,
                env=dict(env) if env else None,
                timeout=math.ceil(timeout) if timeout else None,
                text=False,
            ),
            self.config.retries,
        )

        async def communicate() -> ExecOutput:
            if data is not None:
                process.stdin.write(data)
            process.stdin.write_eof()
            await process.stdin.drain.aio()
            stdout, stderr = await asyncio.gather(
                _bounded_read(process.stdout, budget), _bounded_read(process.stderr, budget)
            )
            return ExecOutput(await process.wait.aio(), stdout, stderr)

        try:
            # Modal enforces `timeout` in the sandbox; this bounds the client side too.
            result = await asyncio.wait_for(communicate(), (timeout + 30) if timeout else None)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{cmd[0]} did not finish within {timeout}s") from None
        except SandboxOutputLimitError:
            raise
        except Exception as exc:
            raise translate_error(exc) from exc
        overran = timeout is not None and time.monotonic() - started >= timeout
        if overran and result.returncode != 0:  # killed by Modal's deadline
            raise TimeoutError(f"{cmd[0]} did not finish within {timeout}s")
        return result

    async def _script(self, script: str, *args: str, input: bytes | None = None) -> ExecOutput:
        return await self.exec(["sh", "-c", script, "sh", *args], input=input)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = resolve_path(path, self.config.workdir)
        begun = await self._script(_WRITE_BEGIN, target)
        if begun.returncode != 0:
            raise os_error_for(target, begun.returncode, begun.stderr) or SandboxExecError(
                f"cannot write {target} in {self.name}: {begun.stderr.decode(errors='replace')}"
            )
        try:
            for chunk in base64_chunks(data):
                step = await self._script(_WRITE_CHUNK, target, input=chunk)
                if step.returncode != 0:
                    raise os_error_for(target, step.returncode, step.stderr) or SandboxExecError(
                        f"writing {target}: {step.stderr.decode(errors='replace')}"
                    )
            done = await self._script(_WRITE_COMMIT, target, f"{mode:o}")
            if done.returncode != 0:
                raise os_error_for(target, done.returncode, done.stderr) or SandboxExecError(
                    f"writing {target}: {done.stderr.decode(errors='replace')}"
                )
        except BaseException:
            await asyncio.shield(self._script(_WRITE_ABORT, target))
            raise

    async def read_file(self, path: str) -> bytes:
        target = resolve_path(path, self.config.workdir)
        sized = await self._script(_READ_SIZE, target)
        if sized.returncode != 0:
            raise os_error_for(target, sized.returncode, sized.stderr) or SandboxExecError(
                f"cannot read {target} in {self.name}: {sized.stderr.decode(errors='replace')}"
            )
        size = int(sized.stdout.strip() or b"0")
        parts = []
        for index in range(chunk_count(size)):
            chunk = await self._script(_READ_CHUNK, target, str(CHUNK_BYTES), str(index))
            if chunk.returncode != 0:
                raise os_error_for(target, chunk.returncode, chunk.stderr) or SandboxExecError(
                    f"reading {target}: {chunk.stderr.decode(errors='replace')}"
                )
            parts.append(base64.b64decode(chunk.stdout))
        data = b"".join(parts)
        if len(data) != size:
            raise SandboxExecError(f"{target} changed while it was read ({len(data)} of {size})")
        return data

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        process = await with_retries(
            lambda: self._sandbox.exec.aio(
                *as_user(cmd, user), env=dict(env) if env else None, text=False
            ),
            self.config.retries,
        )
        return _ModalStream(process)

    async def cleanup(self) -> None:
        try:
            await self._sandbox.terminate.aio()
        except Exception:  # already gone: terminated is what we wanted
            pass


_STDIN_PIECE = 1 << 20


class _ModalStream(ChunkedLineStream):
    def __init__(self, process: Any) -> None:
        super().__init__()
        self._process = process
        self._chunks = process.stdout.__aiter__()

    async def write(self, data: bytes) -> None:
        # Modal's stdin buffer refuses more than a few MiB between drains: the runtime's
        # bytes (the first start's input) go in pieces.
        view = memoryview(data)
        for start in range(0, max(len(view), 1), _STDIN_PIECE):
            self._process.stdin.write(bytes(view[start : start + _STDIN_PIECE]))
            await self._process.stdin.drain.aio()

    async def _next_chunk(self, max_payload: int) -> bytes | None:
        # Modal's chunks come as they come: the line splitter bounds what is kept.
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        return chunk if isinstance(chunk, bytes) else str(chunk).encode()

    async def close(self) -> None:
        self._process.stdin.write_eof()
        try:
            await self._process.stdin.drain.aio()
        except Exception:
            pass


async def cleanup_leftovers(app_name: str = "sandbox-tools") -> list[str]:
    """Terminate every sandbox we created in `app_name` (an interrupted run's leftovers)."""
    modal = _sdk()
    app = await with_retries(lambda: modal.App.lookup.aio(app_name, create_if_missing=False))
    terminated = []
    async for sandbox in modal.Sandbox.list.aio(app_id=app.app_id):
        tags = await sandbox.get_tags.aio()
        if LEFTOVER_TAG in tags:
            await sandbox.terminate.aio()
            terminated.append(sandbox.object_id)
    return terminated
