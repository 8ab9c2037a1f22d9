"""The engine transport against a scripted engine on a real Unix socket.

The engine here sends an exec's output frames in the same write as its `101 UPGRADED`
headers, as a busy real engine sometimes does: the SDK's socket hand-off lost those
frames (a short command came back with empty output and exit 0, seen as a flake of
test_engines on the nested engine). Both transports must deliver every byte.

The same engine can also misbehave on purpose, per endpoint: never answer, answer
late or a byte at a time, or answer malformed JSON. Against it every call must end
within its deadline with a typed error (THREAT_MODEL.md, rule 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import struct
import tarfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox_tools.errors import ConfigurationError, SandboxExecError
from sandbox_tools.sandboxes import docker_api
from sandbox_tools.sandboxes.docker import DockerSandbox
from sandbox_tools.sandboxes.docker_api import (
    STDERR,
    STDOUT,
    EngineAPI,
    EngineRequestError,
    EngineTimeoutError,
    NativeEngineAPI,
    SdkEngineAPI,
    engine_api,
)
from sandbox_tools.settings import load_settings
from tests.support import peak_rss_mib, reset_peak_rss, rss_mib

DEADLINE = 0.5  # every engine deadline, in the tests that shorten them
SLACK = 3.0  # generous: a loaded CI host, never the minutes an unbounded wait takes


def _frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def _http(status: int, body: bytes, reason: str = "X") -> bytes:
    """A whole engine response, for answers scripted byte for byte."""
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _endpoint(method: str, path: str) -> str:
    """Which engine call a request is: the names ScriptedEngine's knobs use."""
    if "/images/" in path:
        return "image"
    if "/archive" in path:
        return "put" if method == "PUT" else "get"
    if path.endswith("/exec") and method == "POST":
        return "create"
    if path.endswith("/start"):
        return "start"
    return "inspect" if path.endswith("/json") else "other"


def _tar(name: str, content: bytes | str) -> bytes:
    """An archive as dockerd sends for one path: a file, or (str) a symbolic link."""
    info = tarfile.TarInfo(name)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if isinstance(content, str):
            info.type, info.linkname = tarfile.SYMTYPE, content
            tar.addfile(info)
        else:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


class ScriptedEngine:
    """Answers exec create/start/inspect and archive calls the way dockerd does.

    Or, per endpoint ("create", "start", "inspect", "put", "get", "image"), the way a
    hung or hostile one does: `hang` never answers (until the test ends), `delay` answers
    late, `trickle` sends an archive's body a byte at a time, `answers` replaces the
    whole response with scripted bytes.
    """

    def __init__(self, output: list[bytes]) -> None:
        self.output = output
        self.stdin = b""
        self.requests: list[str] = []
        self.bodies: list[int] = []
        self.uploads_waited: list[bool] = []
        self.running = 0
        self.most_running = 0
        self.hang: set[str] = set()
        self.delay: dict[str, float] = {}
        self.trickle: set[str] = set()
        self.answers: dict[str, bytes] = {}
        self.files: dict[str, bytes | str] = {}  # GET archive: path -> content or link target
        self.released = asyncio.Event()  # set when the test ends: hung handlers let go
        self.handlers: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        # A client that gave up (its deadline passed) closes on us mid-answer: expected.
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self._handle(reader, writer)
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line, *lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}
        method, path, _ = request_line.split(" ")
        self.requests.append(f"{method} {path}")
        endpoint = _endpoint(method, path)
        if endpoint in self.hang:  # reads nothing more, answers nothing
            await self.released.wait()
            return
        await asyncio.sleep(self.delay.get(endpoint, 0.0))
        if endpoint in self.answers:
            await reader.read(int(headers.get("content-length", "0")))
            writer.write(self.answers[endpoint])
            await writer.drain()
            return
        waits = headers.get("expect") == "100-continue"
        if "/archive" in path and method == "PUT":
            self.uploads_waited.append(waits)
        if "missing" in path:  # refused before the body is read, as dockerd does
            await self._answer(writer, 404, {"message": "Could not find the file"})
            return
        if waits:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "hangup" in path:  # gives up halfway through the body without answering
            await reader.read(10)
            writer.close()
            return
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.bodies.append(len(body))
        if path.endswith("/exec") and method == "POST":
            assert json.loads(body)["Cmd"]
            await self._answer(writer, 201, {"Id": "e1"})
        elif path.endswith("/start"):
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            # Headers and the first frames in one write.
            writer.write(
                b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + b"".join(self.output)
            )
            await writer.drain()
            self.stdin = await reader.read()  # until the client ends stdin (or closes)
            await asyncio.sleep(0.05)
            self.running -= 1
            writer.close()
        elif endpoint == "image":
            await self._answer(writer, 200, {"Id": "i1", "Architecture": "arm64"})
        elif path.endswith("/json"):
            await self._answer(writer, 200, {"Running": False, "ExitCode": 3})
        elif "/archive" in path and method == "PUT":
            await self._answer(writer, 200, None)
        elif endpoint in self.trickle:
            body = b"x" * 100_000
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            for byte in range(len(body)):
                if self.released.is_set():
                    break
                writer.write(body[byte : byte + 1])
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.close()
        elif "/archive" in path:
            wanted = urllib.parse.unquote(path.partition("path=")[2])
            if wanted in self.files:
                await self._answer_bytes(
                    writer, 200, _tar(wanted.rpartition("/")[2], self.files[wanted])
                )
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            await writer.drain()
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, value: Any) -> None:
        body = b"" if value is None else json.dumps(value).encode()
        await ScriptedEngine._answer_bytes(writer, status, body)

    @staticmethod
    async def _answer_bytes(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        writer.write(_http(status, body))
        await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def scripted_engine(
    tmp_path: Path, output: list[bytes] | None = None
) -> AsyncIterator[ScriptedEngine]:
    engine = ScriptedEngine(output or [])
    server = await asyncio.start_unix_server(engine.handle, path=str(tmp_path / "engine.sock"))
    async with server:
        try:
            yield engine
        finally:
            engine.released.set()  # hung and trickling handlers end: no task outlives the test
            if engine.handlers:
                await asyncio.wait(engine.handlers, timeout=SLACK)


def _both(tmp_path: Path) -> list[EngineAPI]:
    socket_path = str(tmp_path / "engine.sock")
    client = docker.DockerClient(base_url=f"unix://{socket_path}", version="1.41")
    return [NativeEngineAPI("1.41", 4, unix_path=socket_path), SdkEngineAPI(client, 4)]


async def _run(api: EngineAPI, data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    exec_id = await api.exec_create("c1", ["true"], True, None, None, None)
    conn = await api.exec_start(exec_id)
    await conn.send(data)
    await conn.close_input()
    frames = []
    while (frame := await conn.next_frame()) is not None:
        frames.append(frame)
    conn.close()
    return frames, await api.exit_code(exec_id)


async def test_frames_sent_with_the_upgrade_headers_are_delivered(tmp_path: Path) -> None:
    """THREAT_MODEL rule 2 (the host is never misled): no output is lost or invented."""
    output = [_frame(STDOUT, b"ok\n"), _frame(STDERR, b"warn\n"), _frame(STDOUT, b"x" * 70000)]
    async with scripted_engine(tmp_path, output) as engine:
        for api in _both(tmp_path):
            frames, code = await _run(api, b"request\n")
            assert frames == [(STDOUT, b"ok\n"), (STDERR, b"warn\n"), (STDOUT, b"x" * 70000)]
            assert code == 3
            assert engine.stdin == b"request\n"


async def test_archives_and_engine_errors(tmp_path: Path) -> None:
    """THREAT_MODEL rule 2: an engine's refusal reaches the caller as itself.

    dockerd answers an upload into a missing directory with 404 before reading the
    body and closes. Had the body been sent already, the send could break and asyncio
    would drop the unread answer: write_file, which walks up to the nearest existing
    directory by such refusals, failed with a broken pipe (a CI flake). So every
    upload waits for the engine's go-ahead, whatever its size.
    """
    async with scripted_engine(tmp_path, []) as engine:
        for api in _both(tmp_path):
            engine.uploads_waited.clear()
            assert await api.get_archive("c1", "/etc/x", 1 << 20) == b"hello world"
            with pytest.raises(SandboxExecError, match="larger than 4 bytes"):
                await api.get_archive("c1", "/etc/x", 4)
            await api.put_archive("c1", "/tmp", [b"t", b"ar"])
            with pytest.raises(EngineRequestError) as missing:
                await api.put_archive("c1", "/missing", [b"tar"])
            assert missing.value.status == 404
            # A large upload waits for the engine's go-ahead, so a refusal arrives whole
            # instead of breaking the send (an engine answers 404 without reading it).
            big = [b"t" * 9_000_000]
            await api.put_archive("c1", "/tmp", big)
            with pytest.raises(EngineRequestError) as refused:
                await api.put_archive("c1", "/missing", big)
            assert refused.value.status == 404
            if isinstance(api, NativeEngineAPI):  # the SDK's uploads are its own affair
                assert engine.uploads_waited == [True] * 4
        # An engine that hangs up in the middle of a body is an error, not a traceback.
        for api in _both(tmp_path):
            for size in (100, 9_000_000):
                with pytest.raises(SandboxExecError):
                    await api.put_archive("c1", "/hangup", [b"t" * size])


async def test_the_engine_limit_queues_execs(tmp_path: Path) -> None:
    async with scripted_engine(tmp_path, [_frame(STDOUT, b"ok\n")]) as engine:
        api = NativeEngineAPI("1.41", 2, unix_path=str(tmp_path / "engine.sock"))

        async def one() -> None:
            async with api.slot():
                await _run(api, b"")

        await asyncio.gather(*(one() for _ in range(6)))
        assert engine.most_running == 2


def test_one_api_per_client_and_the_limit_from_the_environment() -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41")
    assert engine_api(client) is engine_api(client)
    assert isinstance(engine_api(client), NativeEngineAPI)
    assert load_settings({}, pyproject=Path("/nonexistent")).engine_concurrency == 32
    environ = {"SANDBOX_TOOLS_ENGINE_CONCURRENCY": "8"}
    assert load_settings(environ, pyproject=Path("/nonexistent")).engine_concurrency == 8
    with pytest.raises(ConfigurationError, match="not a positive whole number"):
        load_settings({"SANDBOX_TOOLS_ENGINE_CONCURRENCY": "0"}, pyproject=Path("/nonexistent"))


# -- a hung, slow or hostile engine (THREAT_MODEL.md, rule 3) ----------------------------


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine deadline DEADLINE seconds, for EngineAPIs made from here on."""
    for name in ("ENGINE_TIMEOUT", "ARCHIVE_TIMEOUT", "SLOT_TIMEOUT"):
        monkeypatch.setattr(docker_api, name, DEADLINE)


def _sandbox(tmp_path: Path, concurrency: int = 4, **attrs: Any) -> DockerSandbox:
    """A DockerSandbox on the scripted engine, its container as the engine described it."""
    client = docker.DockerClient(base_url=f"unix://{tmp_path / 'engine.sock'}", version="1.41")
    described = {"Id": "c1", "Name": "/scripted", "Image": "sha256:i1", "HostConfig": {}}
    container = client.containers.prepare_model({**described, **attrs})
    engine_api(client).concurrency = concurrency  # before any slot is taken on this loop
    return DockerSandbox(container, client)


async def _outcome(call: Awaitable[Any], seconds: float) -> tuple[BaseException | None, float]:
    """What `call` raised (None: it returned) and after how long, given seconds + SLACK.

    A call still waiting then fails the test at once: the unbounded code it defends
    against would otherwise hang it until the suite's own timeout.
    """
    start = time.monotonic()
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=seconds + SLACK)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=1)
        pytest.fail(f"still waiting on the engine after {seconds + SLACK:g} s")
    return task.exception(), time.monotonic() - start


async def _times_out(call: Awaitable[Any], seconds: float = DEADLINE) -> EngineTimeoutError:
    error, elapsed = await _outcome(call, seconds)
    assert isinstance(error, EngineTimeoutError), repr(error)
    assert isinstance(error, TimeoutError) and isinstance(error, SandboxExecError)
    assert elapsed < seconds + SLACK
    return error


def _operations(sandbox: DockerSandbox) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each sandbox call that waits on the engine, by the endpoint it needs first."""
    return {
        "create": lambda: sandbox.open_stream(["runtime"]),
        "get": lambda: sandbox.read_file("/etc/x"),
        "put": lambda: sandbox.write_file("/tmp/x", b"data"),
        "image": sandbox.architecture_hint,
    }


@pytest.mark.security
async def test_exec_timeout_covers_the_wait_for_an_engine_slot(tmp_path: Path) -> None:
    """THREAT_MODEL rule 3: the host is never hung by the engine.

    Four exec(timeout=2) at once against an engine that never answers, one engine slot:
    each used to wait for the slot outside its timeout (the last returned after 8 s; a
    real finding: 29 s). Each must end within its own 2 s, with a TimeoutError.
    """
    async with scripted_engine(tmp_path) as engine:
        engine.hang.add("create")
        sandbox = _sandbox(tmp_path, concurrency=1)
        outcomes = await asyncio.gather(
            *(_outcome(sandbox.exec(["true"], timeout=2), 2) for _ in range(4))
        )
        for error, elapsed in outcomes:
            assert isinstance(error, TimeoutError), repr(error)
            assert elapsed < 2 + SLACK


@pytest.mark.security
@pytest.mark.parametrize("endpoint", ["create", "start", "inspect"])
async def test_every_exec_request_has_a_deadline(
    tmp_path: Path, short_deadlines: None, endpoint: str
) -> None:
    """THREAT_MODEL rule 3: the host is never hung by the engine.

    An exec without a timeout of its own (the caller bounds it) still gets each engine
    request answered within ENGINE_TIMEOUT, on both transports, and through the sandbox.
    """
    async with scripted_engine(tmp_path, [_frame(STDOUT, b"ok\n")]) as engine:
        engine.hang.add(endpoint)
        for api in _both(tmp_path):
            error = await _times_out(_run(api, b""))
            assert "did not" in str(error)
        await _times_out(_sandbox(tmp_path).exec(["true"], input=b"", timeout=None))


@pytest.mark.security
@pytest.mark.parametrize("endpoint", ["create", "get", "put", "image"])
async def test_streams_and_files_against_a_hung_engine(
    tmp_path: Path, short_deadlines: None, endpoint: str
) -> None:
    """THREAT_MODEL rule 3: the host is never hung by the engine.

    open_stream, read_file, write_file and architecture_hint had no deadline at all: an
    engine that accepts the connection and never answers held the caller forever.
    """
    async with scripted_engine(tmp_path) as engine:
        engine.hang.add(endpoint)
        await _times_out(_operations(_sandbox(tmp_path))[endpoint]())


@pytest.mark.security
@pytest.mark.parametrize("operation", ["exec", "create", "get", "put"])
async def test_the_wait_for_an_engine_slot_has_a_deadline(
    tmp_path: Path, short_deadlines: None, operation: str
) -> None:
    """THREAT_MODEL rule 3: the host is never hung by the engine.

    With every slot held (by execs stuck on the engine), a call that needs one waits
    at most SLOT_TIMEOUT; an exec without a timeout of its own too.
    """
    async with scripted_engine(tmp_path):
        sandbox = _sandbox(tmp_path, concurrency=1)
        calls = {**_operations(sandbox), "exec": lambda: sandbox.exec(["true"], timeout=None)}
        async with engine_api(sandbox.client).slot():
            error = await _times_out(calls[operation]())
        assert "slot" in str(error)


@pytest.mark.security
async def test_a_slow_engine_is_cut_off_at_the_deadline(
    tmp_path: Path, short_deadlines: None
) -> None:
    """THREAT_MODEL rule 3: the host is never hung by the engine.

    The deadline bounds a whole answer, not each read: an engine that answers late, or
    sends an archive a byte at a time (100 kB: over an hour), is cut off; one that
    answers within the deadline is served.
    """
    async with scripted_engine(tmp_path, [_frame(STDOUT, b"ok\n")]) as engine:
        sandbox = _sandbox(tmp_path)
        engine.delay["create"] = DEADLINE / 5
        assert (await sandbox.exec(["true"], input=b"", timeout=None)).stdout == b"ok\n"
        engine.delay["create"] = DEADLINE * 4
        await _times_out(sandbox.exec(["true"], input=b"", timeout=None))
        engine.trickle.add("get")
        await _times_out(sandbox.read_file("/etc/x"))


MALFORMED = [
    # (endpoint, the engine's whole answer, what the error must name); "nested too deep"
    # is a RecursionError in json.loads, before and after the engine refuses (500)
    pytest.param("create", _http(201, b"not json"), "not JSON|malformed", id="create-not-json"),
    pytest.param(
        "create",
        _http(201, b"[" * 100_000),
        "not JSON|malformed|JSON values",  # over MAX_ENGINE_JSON_VALUES too, on the native API
        id="create-nested-too-deep",
    ),
    pytest.param("create", _http(201, b'["e1"]'), "not an object", id="create-a-list"),
    pytest.param("create", _http(201, b"{}"), "no valid Id", id="create-no-id"),
    pytest.param("create", _http(201, b'{"Id": 5}'), "no valid Id", id="create-id-not-a-string"),
    pytest.param(
        "create",
        _http(201, b'{"Id": "e1/../../containers/c1/kill?"}'),
        "no valid Id",
        id="create-id-a-path",
    ),
    pytest.param(
        "create",
        _http(500, b"[" * 100_000),
        "\\[\\[\\[|HTTP 500|malformed",
        id="error-body-nested-too-deep",
    ),
    pytest.param("inspect", _http(200, b"[0]"), "not an object", id="inspect-a-list"),
    pytest.param(
        "inspect", _http(200, b'{"ExitCode": 0}'), "Running=None", id="inspect-no-running"
    ),
    pytest.param(
        "inspect",
        _http(200, b'{"Running": "no", "ExitCode": 0}'),
        "Running='no'",
        id="inspect-running-a-string",
    ),
    pytest.param(
        "inspect",
        _http(200, b'{"Running": false, "ExitCode": "3"}'),
        "ExitCode='3'",
        id="inspect-exit-code-a-string",
    ),
    pytest.param(
        "inspect",
        _http(200, b'{"Running": false, "ExitCode": true}'),
        "ExitCode=True",
        id="inspect-exit-code-a-boolean",
    ),
    pytest.param(
        "inspect",
        _http(200, b'{"Running": false, "ExitCode": 1.5}'),
        "ExitCode=1.5",
        id="inspect-exit-code-a-float",
    ),
]


@pytest.mark.security
@pytest.mark.parametrize(("endpoint", "answer", "named"), MALFORMED)
async def test_malformed_engine_json_is_a_typed_error(
    tmp_path: Path, endpoint: str, answer: bytes, named: str
) -> None:
    """THREAT_MODEL rule 3: a malformed response is a typed error, never AttributeError.

    Every JSON answer is checked before use, on both transports: wrong types or missing
    keys raised KeyError, TypeError, AttributeError, ValueError or RecursionError, or
    were quietly coerced (an ExitCode of "3" or true became an exit code).
    """
    async with scripted_engine(tmp_path, [_frame(STDOUT, b"ok\n")]) as engine:
        engine.answers[endpoint] = answer
        for api in _both(tmp_path):
            with pytest.raises(SandboxExecError, match=named):
                await _run(api, b"")


DENSE = b'{"Running": false, "ExitCode": 0, "pad": [' + b"{}," * 5_592_000 + b"{}]}"


@pytest.mark.security
@pytest.mark.parametrize("status", [200, 500], ids=["answer", "error"])
async def test_dense_engine_json_is_refused_before_it_is_parsed(
    tmp_path: Path, status: int
) -> None:
    """THREAT_MODEL.md rule 3 (everything read from a sandbox is bounded in bytes and
    time): a hostile engine answers exec inspect with 16 MiB of `[{},{},...]`, within
    the byte cap. Counted in values over the raw bytes, it is refused unparsed: parsed,
    it took the host from 65 to 505 MiB and held the loop 0.7 s per answer. An error
    answer as dense is reported by its first bytes, unparsed too."""
    async with scripted_engine(tmp_path, [_frame(STDOUT, b"ok\n")]) as engine:
        engine.answers["inspect"] = _http(status, DENSE)
        api = NativeEngineAPI("1.41", 4, unix_path=str(tmp_path / "engine.sock"))
        reset_peak_rss()
        before = rss_mib()
        started = time.monotonic()
        for _ in range(3):
            named = "JSON values" if status == 200 else "ExitCode"  # the error's first bytes
            with pytest.raises(SandboxExecError, match=named):
                await api.exit_code("e1")
        elapsed = time.monotonic() - started
    growth = peak_rss_mib() - before
    print(f"16 MiB of dense engine JSON x3: RSS {before:.0f} MiB + {growth:.0f}, {elapsed:.2f} s")
    assert growth < 150, f"the host grew by {growth:.0f} MiB"
    assert elapsed < 2


@pytest.mark.security
async def test_malformed_http_and_archives_are_typed_errors(tmp_path: Path) -> None:
    """THREAT_MODEL rule 3: a malformed response is a typed error, never AttributeError.

    A status line int() refuses ("²00" passes isdigit), an archive that is no tar, a
    container description of the wrong type, an image description that is no object:
    each used to escape as ValueError, tarfile.ReadError, AttributeError or Exception.
    """
    async with scripted_engine(tmp_path) as engine:
        engine.answers["create"] = "HTTP/1.1 ²00 OK\r\n\r\n".encode("latin-1")
        with pytest.raises(SandboxExecError, match="status line"):
            await _run(_both(tmp_path)[0], b"")
        with pytest.raises(SandboxExecError, match="malformed archive"):
            await _sandbox(tmp_path).read_file("/etc/x")  # "hello world": no tar
        with pytest.raises(SandboxExecError, match="HostConfig"):
            await _sandbox(tmp_path, HostConfig="yes").write_file("/tmp/x", b"")
        engine.answers["image"] = _http(200, b"[]")
        with pytest.raises(SandboxExecError, match="Architecture"):
            await _sandbox(tmp_path).architecture_hint()


@pytest.mark.security
async def test_read_file_follows_links_in_the_container(tmp_path: Path) -> None:
    """THREAT_MODEL rule 3: a response is a typed error or the data, never a KeyError.

    The engine archives a symbolic link itself; reading one raised KeyError from
    tarfile. A link is followed as open() would (relative to its directory), a loop is
    ELOOP.
    """
    async with scripted_engine(tmp_path) as engine:
        engine.files.update(
            {
                "/data/real": b"content",
                "/data/relative": "real",
                "/etc/absolute": "/data/relative",
                "/loop/a": "b",
                "/loop/b": "a",
            }
        )
        sandbox = _sandbox(tmp_path)
        assert await sandbox.read_file("/data/real") == b"content"
        assert await sandbox.read_file("/etc/absolute") == b"content"
        with pytest.raises(OSError) as loop:
            await sandbox.read_file("/loop/a")
        assert loop.value.errno == errno.ELOOP
