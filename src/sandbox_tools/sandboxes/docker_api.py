"""The Docker engine's exec and archive API, spoken from asyncio.

The docker SDK is synchronous: driving it from an event loop cost one OS thread per
exec and one per read of a persistent stream, so a host with hundreds of sandboxes
ran hundreds of threads. For engines reached over a Unix socket or plain
TCP, this module speaks the few HTTP calls an exec needs (create, start with the
connection upgraded to a raw stream, inspect) and the archive calls directly on
asyncio streams: no thread at all per call or per stream.

Owning the connection also fixes a lost-output bug of the SDK's socket hand-off: its
HTTP parser reads the upgrade response through a buffer, and output frames that
arrived in the same read as the response headers stayed in that buffer, unseen by a
reader of the raw socket. A short command on a busy host came back with no output.
Here every byte after the headers stays in the one stream reader.

Engines over TLS or SSH keep the SDK's socket, in a worker thread per blocking call
(asyncio cannot half-close a TLS stream, which is how an exec's stdin is ended).

A per-engine limit (settings: `engine-concurrency`, default 32) bounds how many
execs run at once against one engine, so that 64 samples starting together queue
instead of overwhelming it.

A hung or hostile engine must not hang the host (THREAT_MODEL.md, rule 3): every wait
on the engine has a deadline (ENGINE_TIMEOUT for a control request, ARCHIVE_TIMEOUT for
a file copy, SLOT_TIMEOUT for a free slot), past which the caller gets EngineTimeoutError;
every JSON answer is bounded in bytes (MAX_ENGINE_JSON) and in values before it is parsed
(MAX_ENGINE_JSON_VALUES), and checked before use: a malformed one is a SandboxExecError
naming what was wrong.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import functools
import json
import re
import socket
import struct
import threading
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import docker.errors
import requests.exceptions
from docker import DockerClient

from sandbox_tools.errors import ConfigurationError, SandboxExecError
from sandbox_tools.protocol import json_values
from sandbox_tools.settings import DEFAULT_ENGINE_CONCURRENCY

T = TypeVar("T")
FRAME_HEADER = struct.Struct(">BxxxL")
STDOUT, STDERR = 1, 2
MAX_FRAME = 1 << 32
MAX_RESPONSE_HEAD = 64 * 1024  # status line and headers of one engine response
MAX_ENGINE_JSON = 16 * 1024 * 1024  # an engine's JSON answer (exec inspect and the like)
# ...and the values in it, counted over the raw bytes before parsing (protocol.json_values):
# 16 MiB of `[{},{},...]` parsed is 440 MiB of objects and most of a second of the loop.
# An exec inspect holds a few dozen values plus the command's arguments.
MAX_ENGINE_JSON_VALUES = 100_000
SEND_SLICE = 256 * 1024  # large bodies go out in slices: the transport copies only what waits
CONTINUE_WAIT = 5.0  # seconds to wait for "100 Continue" before sending anyway
# Deadlines (seconds) on the engine, each read when an EngineAPI is made:
ENGINE_TIMEOUT = 60.0  # one control request (exec create, start, inspect): the SDK's default
ARCHIVE_TIMEOUT = 600.0  # one file copy in or out, up to 256 MiB (docker.MAX_READ_FILE)
SLOT_TIMEOUT = 600.0  # a free engine slot, for calls without a timeout of their own
_ENGINE_ID = re.compile(r"[0-9A-Za-z_.-]{1,128}")  # an exec id, spliced into request paths


class EngineRequestError(SandboxExecError):
    """The engine answered an API call with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class EngineTimeoutError(SandboxExecError, TimeoutError):
    """The engine did not answer within its deadline (THREAT_MODEL.md, rule 3).

    Both a SandboxExecError (the provider could not do it) and a TimeoutError, so every
    caller that already bounds a sandbox call in time (the injector, the CLI) handles it.
    """

    default_remedy = "The Docker engine is hung or overloaded; check it with `docker info`."


async def within(seconds: float, what: str, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or EngineTimeoutError naming `what` after `seconds`.

    A shorter deadline inside that fires first keeps its own, more precise, message.
    """
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except EngineTimeoutError:
        raise
    except asyncio.TimeoutError:  # the builtin one from 3.11 on
        raise EngineTimeoutError(f"the Docker engine did not {what} within {seconds:g} s") from None


def _json(answer: bytes, what: str) -> Any:
    values = json_values(answer)
    if values > MAX_ENGINE_JSON_VALUES:
        raise SandboxExecError(
            f"the engine's answer to {what} may hold {values} JSON values; the host parses "
            f"at most {MAX_ENGINE_JSON_VALUES}"
        )
    try:
        return json.loads(answer)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deep
        raise SandboxExecError(f"the engine's answer to {what} is not JSON") from None


def _json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SandboxExecError(
            f"the engine's answer to {what} is a JSON {type(value).__name__}, not an object"
        )
    return value


def _exec_id(value: Any) -> str:
    """The Id of an exec-create answer: a short token, as it is put into request paths."""
    ident = _json_object(value, "exec create").get("Id")
    if not isinstance(ident, str) or not _ENGINE_ID.fullmatch(ident):
        raise SandboxExecError(f"the engine's answer to exec create has no valid Id: {ident!r:.80}")
    return ident


def _exec_state(info: Any, exec_id: str) -> tuple[bool, int | None]:
    """(Running, ExitCode) of an exec-inspect answer; anything else there is an error."""
    what = f"inspect of exec {exec_id[:12]}"
    info = _json_object(info, what)
    running, code = info.get("Running"), info.get("ExitCode")
    if not isinstance(running, bool):
        raise SandboxExecError(f"the engine's {what} has Running={running!r:.80}, not a boolean")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise SandboxExecError(f"the engine's {what} has ExitCode={code!r:.80}, not an integer")
    return running, code


class FrameTooLarge(Exception):
    """A frame larger than the reader may still accept; `args[0]` is its size."""


class ExecConnection(abc.ABC):
    """A started exec: its stdin and its multiplexed stdout/stderr frames."""

    @abc.abstractmethod
    async def send(self, data: bytes | memoryview) -> None: ...

    @abc.abstractmethod
    async def close_input(self) -> None:
        """End the process's stdin; its output keeps arriving."""

    @abc.abstractmethod
    async def next_frame(self, max_payload: int = MAX_FRAME) -> tuple[int, bytes] | None:
        """The next (stream, payload), None at the end; FrameTooLarge past `max_payload`.

        The size is checked before the payload is read: a header alone may announce 4 GiB.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection at once, waking any pending read."""


class EngineAPI(abc.ABC):
    """What a sandbox needs of one engine, each call awaitable."""

    def __init__(
        self,
        concurrency: int,
        timeout: float | None = None,
        archive_timeout: float | None = None,
        slot_timeout: float | None = None,
    ) -> None:
        """Deadlines left None are the module's (ENGINE_TIMEOUT and so on) at this moment."""
        self.concurrency = concurrency
        self.timeout = ENGINE_TIMEOUT if timeout is None else timeout
        self.archive_timeout = ARCHIVE_TIMEOUT if archive_timeout is None else archive_timeout
        self.slot_timeout = SLOT_TIMEOUT if slot_timeout is None else slot_timeout
        # Whether the engine runs on this host (Sandbox.bytes_are_cheap); False unless a
        # transport knows.
        self.on_this_host = False
        # asyncio primitives belong to one loop; a sandbox may be driven by several
        # (tests, `asyncio.run` per command), each gets its own limiter.
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._slots = weakref.WeakKeyDictionary()

    @contextlib.asynccontextmanager
    async def slot(self, timeout: float | None = None) -> AsyncIterator[None]:
        """Hold one of the engine's exec slots for the duration of the block.

        The wait for one ends with EngineTimeoutError after `timeout` seconds (None:
        `slot_timeout`): slots held by execs on a hung engine must not queue the rest
        forever.
        """
        loop = asyncio.get_running_loop()
        semaphore = self._slots.get(loop)
        if semaphore is None:
            semaphore = self._slots[loop] = asyncio.Semaphore(self.concurrency)
        seconds = self.slot_timeout if timeout is None else timeout
        await within(seconds, "free an exec slot", semaphore.acquire())
        try:
            yield
        finally:
            semaphore.release()

    async def sdk_call(self, what: str, function: Callable[[], T]) -> T:
        """A blocking docker SDK call (off the hot path) within the control deadline."""
        return await _blocking(self.timeout, what, function)

    @abc.abstractmethod
    async def exec_create(
        self,
        container_id: str,
        cmd: list[str],
        stdin: bool,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
    ) -> str: ...

    @abc.abstractmethod
    async def exec_start(self, exec_id: str) -> ExecConnection: ...

    @abc.abstractmethod
    async def exec_inspect(self, exec_id: str) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def put_archive(
        self, container_id: str, directory: str, archive: Sequence[bytes]
    ) -> None:
        """Extract `archive` into `directory`; EngineRequestError(404) if it is missing."""

    @abc.abstractmethod
    async def get_archive(self, container_id: str, path: str, max_bytes: int) -> bytes:
        """A tar of `path`; EngineRequestError(404) if it is missing."""

    @abc.abstractmethod
    async def path_mode(self, container_id: str, path: str) -> int | None:
        """The Go `os.FileMode` bits the engine reports for `path` (links not followed),
        or None if it is missing: a look without reading anything of the file."""

    async def exit_code(self, exec_id: str) -> int:
        """The exec's exit code, polled for within one control deadline in all."""

        async def poll() -> int:
            # The engine can report the exit code a moment after the stream's end.
            for _ in range(200):
                running, code = _exec_state(await self.exec_inspect(exec_id), exec_id)
                if not running and code is not None:
                    return code
                await asyncio.sleep(0.005)
            raise SandboxExecError(f"exec {exec_id[:12]} did not report an exit code")

        return await within(self.timeout, f"report exec {exec_id[:12]}'s exit code", poll())


def _exec_config(
    cmd: list[str],
    stdin: bool,
    cwd: str | None,
    env: Mapping[str, str] | None,
    user: str | None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "Cmd": cmd,
        "AttachStdin": stdin,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "User": user or "",
    }
    if env:
        config["Env"] = [f"{key}={value}" for key, value in env.items()]
    if cwd:
        config["WorkingDir"] = cwd
    return config


# -- the native transport: HTTP/1.1 on asyncio streams ----------------------------------


class _StreamExec(ExecConnection):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send(self, data: bytes | memoryview) -> None:
        await _write_slices(self._writer, [data])

    async def close_input(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            if self._writer.can_write_eof():
                self._writer.write_eof()

    async def next_frame(self, max_payload: int = MAX_FRAME) -> tuple[int, bytes] | None:
        try:
            header = await self._reader.readexactly(FRAME_HEADER.size)
            stream, length = FRAME_HEADER.unpack(header)
            if length > max_payload:
                raise FrameTooLarge(length)
            return stream, await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    def close(self) -> None:
        # A transport closes only once its buffer is sent: with bytes the engine no longer
        # reads (a sandbox whose `head` never took its input), it would stay open for the
        # process's life. Those bytes have nobody to reach: drop them and release it now.
        transport = self._writer.transport
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            self._writer.close()


async def _write_slices(writer: asyncio.StreamWriter, parts: Sequence[bytes | memoryview]) -> None:
    """Write without copying a large body whole into the transport's buffer (a 9 MB
    upload to 64 sandboxes at once would hold 64 copies)."""
    for part in parts:
        view = memoryview(part)
        for start in range(0, len(view), SEND_SLICE):
            writer.write(view[start : start + SEND_SLICE])
            await writer.drain()


_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_DIGITS = re.compile(r"[0-9]{1,15}")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise SandboxExecError("the engine sent an oversized response header") from None
    except (asyncio.IncompleteReadError, ConnectionError):
        raise SandboxExecError("the engine closed the connection without answering") from None
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    # isascii: "²00".isdigit() is true, but int() refuses it
    if len(parts) < 2 or len(parts[1]) != 3 or not (parts[1].isascii() and parts[1].isdigit()):
        raise SandboxExecError(f"the engine sent a malformed status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _stat_mode(stat: object, path: str) -> int:
    """The mode in the engine's path stat (base64 JSON in a header, or the SDK's dict)."""
    if isinstance(stat, str):
        try:
            stat = json.loads(base64.b64decode(stat, validate=True))
        except ValueError:
            stat = None
    mode = stat.get("mode") if isinstance(stat, dict) else None
    if not isinstance(mode, int) or isinstance(mode, bool) or mode < 0:
        raise SandboxExecError(f"the engine's stat of {path[:200]} is malformed")
    return mode


async def _read_body(
    reader: asyncio.StreamReader, headers: Mapping[str, str], max_bytes: int, what: str
) -> bytes:
    def check(size: int) -> None:
        if size > max_bytes:
            raise SandboxExecError(f"{what} is larger than {max_bytes} bytes")

    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size_field = size_line.split(b";", 1)[0].strip()
                if not _HEX.fullmatch(size_field):  # int() would take "-5" and "0x5"
                    raise ValueError(size_field)
                size = int(size_field, 16)
                if size == 0:
                    with contextlib.suppress(asyncio.IncompleteReadError):
                        await reader.readuntil(b"\r\n")  # the trailer's end
                    return bytes(body)
                check(len(body) + size)
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        if "content-length" in headers:
            if not _DIGITS.fullmatch(headers["content-length"]):
                raise ValueError(headers["content-length"])
            length = int(headers["content-length"])
            check(length)
            return await reader.readexactly(length)
        body = bytearray()
        while chunk := await reader.read(1 << 20):
            body += chunk
            check(len(body))
        return bytes(body)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
        raise SandboxExecError(f"the engine sent a malformed body for {what}") from None


def _error_message(status: int, body: bytes) -> str:
    value = None
    if json_values(body) <= MAX_ENGINE_JSON_VALUES:  # else its first bytes say enough
        with contextlib.suppress(ValueError, RecursionError):
            value = json.loads(body)
    message = value.get("message") if isinstance(value, dict) else None
    if not isinstance(message, str):
        message = body[:300].decode(errors="replace")
    return message[:300] or f"HTTP {status}"


class NativeEngineAPI(EngineAPI):
    """An engine on a Unix socket or plain TCP; one short connection per call."""

    def __init__(
        self,
        version: str,
        concurrency: int,
        unix_path: str = "",
        host: str = "",
        port: int = 0,
        *,
        timeout: float | None = None,
        archive_timeout: float | None = None,
        slot_timeout: float | None = None,
    ) -> None:
        super().__init__(concurrency, timeout, archive_timeout, slot_timeout)
        self._prefix = f"/v{version}"
        self._unix_path = unix_path
        # A Unix socket is an engine on this host (or one forwarded to it, the rare case).
        self.on_this_host = bool(unix_path)
        self._host, self._port = host, port

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self._unix_path:
                return await asyncio.open_unix_connection(self._unix_path, limit=MAX_RESPONSE_HEAD)
            return await asyncio.open_connection(self._host, self._port, limit=MAX_RESPONSE_HEAD)
        except OSError as exc:
            raise SandboxExecError(f"cannot reach the Docker engine: {exc}") from None

    async def _send(
        self,
        method: str,
        path: str,
        body: Sequence[bytes] | None = None,
        content_type: str = "application/json",
        upgrade: bool = False,
        may_refuse: bool = False,
    ) -> tuple[int, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
        """Send one request; `may_refuse` holds the body back until the engine says go.

        An engine may answer a request it refuses (an archive into a missing
        directory: 404) and close without reading the body. If our send then breaks,
        asyncio drops the connection with the answer still unread: the caller would
        see a broken pipe instead of the 404 (a CI flake of write_file, which walks up
        to the nearest existing directory by exactly such refusals).
        """
        reader, writer = await self._connect()
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", "Host: docker"]
        lines.append("Connection: Upgrade\r\nUpgrade: tcp" if upgrade else "Connection: close")
        length = sum(len(part) for part in body) if body is not None else 0
        if body is not None:
            lines.append(f"Content-Type: {content_type}\r\nContent-Length: {length}")
        expect = may_refuse and body is not None
        if expect:
            lines.append("Expect: 100-continue")
        try:
            await _write_slices(writer, [("\r\n".join(lines) + "\r\n\r\n").encode()])
            if expect:
                try:
                    status, headers = await asyncio.wait_for(_read_head(reader), CONTINUE_WAIT)
                except asyncio.TimeoutError:
                    status, headers = 100, {}  # an engine that never says: send anyway
                if status != 100:
                    return status, headers, reader, writer
            try:
                await _write_slices(writer, body or ())
            except (BrokenPipeError, ConnectionResetError):
                pass  # it answered before reading everything: its answer says why
            status, headers = await _read_head(reader)
        except ConnectionError as exc:
            writer.close()
            raise SandboxExecError(f"the engine closed the connection: {exc}") from None
        except BaseException:
            writer.close()
            raise
        return status, headers, reader, writer

    async def _call(
        self,
        method: str,
        path: str,
        body: Sequence[bytes] | None = None,
        content_type: str = "application/json",
        max_bytes: int = MAX_ENGINE_JSON,
        may_refuse: bool = False,
        timeout: float | None = None,
    ) -> bytes:
        """One request and its whole answer, within `timeout` (None: the control deadline)."""

        async def exchange() -> bytes:
            status, headers, reader, writer = await self._send(
                method, path, body, content_type, may_refuse=may_refuse
            )
            try:
                answer = await _read_body(reader, headers, max_bytes, f"{method} {path}")
            finally:
                writer.close()
            if status >= 400:
                raise EngineRequestError(status, _error_message(status, answer))
            return answer

        seconds = self.timeout if timeout is None else timeout
        return await within(seconds, f"answer {method} {path[:200]}", exchange())

    async def exec_create(
        self,
        container_id: str,
        cmd: list[str],
        stdin: bool,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
    ) -> str:
        config = json.dumps(_exec_config(cmd, stdin, cwd, env, user)).encode()
        answer = await self._call("POST", f"/containers/{container_id}/exec", [config])
        return _exec_id(_json(answer, "exec create"))

    async def exec_start(self, exec_id: str) -> ExecConnection:
        """The upgraded connection, within the control deadline; its frames are not bounded
        here (an exec's own timeout does that, a stream lives as long as its sandbox)."""

        async def start() -> ExecConnection:
            body = [b'{"Detach": false, "Tty": false}']
            status, headers, reader, writer = await self._send(
                "POST", f"/exec/{exec_id}/start", body, upgrade=True
            )
            if status not in (101, 200):
                try:
                    answer = await _read_body(reader, headers, MAX_ENGINE_JSON, "exec start")
                finally:
                    writer.close()
                raise EngineRequestError(status, _error_message(status, answer))
            return _StreamExec(reader, writer)

        return await within(self.timeout, f"start exec {exec_id[:12]}", start())

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        answer = await self._call("GET", f"/exec/{exec_id}/json")
        return _json_object(_json(answer, "exec inspect"), "exec inspect")

    async def put_archive(
        self, container_id: str, directory: str, archive: Sequence[bytes]
    ) -> None:
        query = urllib.parse.urlencode({"path": directory or "/"})
        await self._call(
            "PUT",
            f"/containers/{container_id}/archive?{query}",
            archive,
            "application/x-tar",
            may_refuse=True,
            timeout=self.archive_timeout,
        )

    async def get_archive(self, container_id: str, path: str, max_bytes: int) -> bytes:
        query = urllib.parse.urlencode({"path": path})
        return await self._call(
            "GET",
            f"/containers/{container_id}/archive?{query}",
            max_bytes=max_bytes,
            timeout=self.archive_timeout,
        )

    async def path_mode(self, container_id: str, path: str) -> int | None:
        query = urllib.parse.urlencode({"path": path})

        async def head() -> int | None:
            status, headers, _, writer = await self._send(
                "HEAD", f"/containers/{container_id}/archive?{query}"
            )
            writer.close()
            if status == 404:
                return None
            if status >= 400:
                raise EngineRequestError(status, f"cannot look at {path}")
            return _stat_mode(headers.get("x-docker-container-path-stat", ""), path)

        return await within(self.timeout, f"look at {path[:200]}", head())


# -- the SDK transport: TLS and SSH engines ---------------------------------------------


def _in_daemon_thread(function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run blocking socket I/O in a daemon thread, not the loop's executor.

    A read that never returns (an exec whose other end stays open) must not hold up
    the event loop's shutdown, which waits for every executor thread. A connection that
    arrives after its caller gave up (a deadline passed) is closed, not leaked.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None], late: Callable[[], None]) -> None:
        (late if future.done() else outcome)()

    def deliver(outcome: Callable[[], None], late: Callable[[], None]) -> None:
        # The caller may have given up and its loop closed: nobody is left to tell.
        try:
            loop.call_soon_threadsafe(settle, outcome, late)
        except RuntimeError:
            late()

    def discard(result: object) -> None:
        if isinstance(result, ExecConnection):
            result.close()

    def run() -> None:
        try:
            result = function(*args)
        except BaseException as exc:
            error = exc
            deliver(lambda: future.set_exception(error), lambda: None)
        else:
            deliver(lambda: future.set_result(result), lambda: discard(result))

    threading.Thread(target=run, daemon=True, name="docker-socket").start()
    return future


class _SocketExec(ExecConnection):
    """The SDK's hijacked socket, read in worker threads."""

    def __init__(self, response: Any, sock: Any, early: bytes) -> None:
        self._owner = response  # keeps the HTTP response (and so the socket) alive
        self._sock = sock
        self._buffer = bytearray(early)

    async def send(self, data: bytes | memoryview) -> None:
        await _in_daemon_thread(self._sock.sendall, data)

    async def close_input(self) -> None:
        with contextlib.suppress(OSError):
            await _in_daemon_thread(self._sock.shutdown, socket.SHUT_WR)

    def _fill(self, count: int) -> bool:
        while len(self._buffer) < count:
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                return False
            self._buffer += chunk
        return True

    def _next_frame(self, max_payload: int) -> tuple[int, bytes] | None:
        try:
            if not self._fill(FRAME_HEADER.size):
                return None
            stream, length = FRAME_HEADER.unpack_from(self._buffer)
            if length > max_payload:
                raise FrameTooLarge(length)
            if not self._fill(FRAME_HEADER.size + length):
                return None
        except OSError:
            return None
        payload = bytes(self._buffer[FRAME_HEADER.size : FRAME_HEADER.size + length])
        del self._buffer[: FRAME_HEADER.size + length]
        return stream, payload

    async def next_frame(self, max_payload: int = MAX_FRAME) -> tuple[int, bytes] | None:
        return await _in_daemon_thread(self._next_frame, max_payload)

    def close(self) -> None:
        # shutdown() wakes a thread blocked in recv() on this socket; close() alone does not.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._owner.close()


def _api_error(exc: docker.errors.APIError) -> EngineRequestError:
    status = exc.response.status_code if exc.response is not None else 500
    return EngineRequestError(status, str(exc.explanation or exc)[:300])


async def _blocking(seconds: float, what: str, function: Callable[[], T]) -> T:
    """A blocking docker SDK call in a daemon thread, within `seconds`, its errors typed.

    Past the deadline the thread is abandoned (the SDK's own socket timeout ends it);
    a daemon thread, so it cannot hold up the loop's or the interpreter's shutdown.
    """
    try:
        return await within(seconds, what, _in_daemon_thread(function))
    except EngineTimeoutError:
        raise  # a TimeoutError, and so an OSError: not a failed connection
    except docker.errors.APIError as exc:
        raise _api_error(exc) from None
    except (ValueError, RecursionError) as exc:  # the SDK's own parsing of a bad answer
        # (before RequestException: requests' JSONDecodeError is both)
        message = f"the Docker engine's answer to {what} is malformed: {exc}"
        raise SandboxExecError(message[:400]) from None
    except (requests.exceptions.RequestException, OSError) as exc:
        message = f"the Docker engine's connection failed: {exc}"
        raise SandboxExecError(message[:400]) from None


class SdkEngineAPI(EngineAPI):
    """Any engine the docker SDK reaches (TLS, SSH): its calls run in worker threads."""

    def __init__(
        self,
        client: DockerClient,
        concurrency: int,
        *,
        timeout: float | None = None,
        archive_timeout: float | None = None,
        slot_timeout: float | None = None,
    ) -> None:
        super().__init__(concurrency, timeout, archive_timeout, slot_timeout)
        self._api = client.api

    async def _run(
        self, what: str, function: Callable[..., T], *args: Any, timeout: float | None = None
    ) -> T:
        """`function(*args)` within `timeout` (None: the control deadline)."""
        seconds = self.timeout if timeout is None else timeout
        return await _blocking(seconds, what, functools.partial(function, *args))

    async def exec_create(
        self,
        container_id: str,
        cmd: list[str],
        stdin: bool,
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
    ) -> str:
        create = functools.partial(
            self._api.exec_create,
            container_id,
            cmd,
            stdin=stdin,
            stdout=True,
            stderr=True,
            environment=dict(env) if env else None,
            workdir=cwd,
            user=user or "",
        )
        return _exec_id(await self._run("answer exec create", create))

    def _start(self, exec_id: str) -> _SocketExec:
        api: Any = self._api  # the SDK's own (untyped) exec-start plumbing
        response = api._post_json(
            api._url("/exec/{0}/start", exec_id),
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
            data={"Tty": False, "Detach": False},
            stream=True,
        )
        sock = api._get_raw_response_socket(response)
        # The response parser may have read output frames along with the headers: they
        # sit in its buffer, not in the socket (the SDK's own hand-off loses them).
        early = _take_buffered(response.raw._fp.fp)
        return _SocketExec(response, getattr(sock, "_sock", sock), early)

    async def exec_start(self, exec_id: str) -> ExecConnection:
        return await self._run(f"start exec {exec_id[:12]}", self._start, exec_id)

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        info = await self._run("answer exec inspect", self._api.exec_inspect, exec_id)
        return _json_object(info, "exec inspect")

    async def put_archive(
        self, container_id: str, directory: str, archive: Sequence[bytes]
    ) -> None:
        data = b"".join(archive)
        ok = await self._run(
            "take an archive",
            self._api.put_archive,
            container_id,
            directory or "/",
            data,
            timeout=self.archive_timeout,
        )
        if not ok:
            raise EngineRequestError(500, "the engine refused the archive")

    async def get_archive(self, container_id: str, path: str, max_bytes: int) -> bytes:
        gave_up = threading.Event()  # past the deadline: the abandoned thread stops reading

        def fetch() -> bytes:
            chunks, _ = self._api.get_archive(container_id, path)
            data = bytearray()
            for chunk in chunks:
                data += chunk
                if len(data) > max_bytes:
                    raise SandboxExecError(f"{path} is larger than {max_bytes} bytes")
                if gave_up.is_set():
                    break
            return bytes(data)

        try:
            return await self._run("send an archive", fetch, timeout=self.archive_timeout)
        finally:
            gave_up.set()

    async def path_mode(self, container_id: str, path: str) -> int | None:
        def look() -> int | None:
            try:
                chunks, stat = self._api.get_archive(container_id, path)
            except docker.errors.NotFound:
                return None
            chunks.close()  # the stat is the response's header: nothing of the body is read
            return _stat_mode(stat, path)

        return await self._run("look at a path", look)


def _take_buffered(reader: Any) -> bytes:
    """The bytes a BufferedReader over a socket already holds, taken out of it.

    The socket is non-blocking meanwhile, so an empty buffer costs no wait.
    """
    sock = getattr(getattr(reader, "raw", None), "_sock", None)
    if sock is None:
        return b""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        early = bytes(reader.peek(0))
        return bytes(reader.read(len(early))) if early else b""
    except (OSError, ValueError):
        return b""
    finally:
        sock.settimeout(timeout)


# -- choosing the transport ------------------------------------------------------------

_APIS: weakref.WeakKeyDictionary[Any, EngineAPI] = weakref.WeakKeyDictionary()
_APIS_LOCK = threading.Lock()


def engine_api(client: DockerClient, concurrency: int | None = None) -> EngineAPI:
    """The one EngineAPI of a docker client, so its limit is shared by every sandbox.

    The limit is fixed when the client is first seen: `engines.docker_client` passes the
    caller's `engine-concurrency` then; a client made elsewhere gets the default. Asking
    for another limit later is refused, not ignored."""
    with _APIS_LOCK:
        api = _APIS.get(client)
        if api is None:
            limit = concurrency if concurrency is not None else DEFAULT_ENGINE_CONCURRENCY
            api = _APIS[client] = _make_api(client, limit)
        elif concurrency is not None and concurrency != api.concurrency:
            raise ConfigurationError(
                f"this Docker client already runs at most {api.concurrency} requests at once",
                remedy="Make one client per engine-concurrency, or pass the same limit.",
            )
        return api


def _make_api(client: DockerClient, concurrency: int) -> EngineAPI:
    from docker.transport import UnixHTTPAdapter

    low = client.api
    version = str(low.api_version)
    adapter = getattr(low, "_custom_adapter", None)
    if isinstance(adapter, UnixHTTPAdapter):
        return NativeEngineAPI(version, concurrency, unix_path=adapter.socket_path)
    base = urllib.parse.urlsplit(str(low.base_url))
    if base.scheme == "http" and base.hostname:
        return NativeEngineAPI(version, concurrency, host=base.hostname, port=base.port or 2375)
    return SdkEngineAPI(client, concurrency)
