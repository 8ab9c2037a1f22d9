"""The engine transport against a scripted engine on a real Unix socket.

The engine here sends an exec's output frames in the same write as its `101 UPGRADED`
headers, as a busy real engine sometimes does: the SDK's socket hand-off lost those
frames (a short command came back with empty output and exit 0, seen as a flake of
test_engines on the nested engine). Both transports must deliver every byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox_tools.errors import ConfigurationError, SandboxExecError
from sandbox_tools.sandboxes.docker_api import (
    STDERR,
    STDOUT,
    EngineAPI,
    EngineRequestError,
    NativeEngineAPI,
    SdkEngineAPI,
    engine_api,
)
from sandbox_tools.settings import load_settings


def _frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


class ScriptedEngine:
    """Answers exec create/start/inspect and archive calls the way dockerd does."""

    def __init__(self, output: list[bytes]) -> None:
        self.output = output
        self.stdin = b""
        self.requests: list[str] = []
        self.bodies: list[int] = []
        self.uploads_waited: list[bool] = []
        self.running = 0
        self.most_running = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        request_line, *lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)}
        method, path, _ = request_line.split(" ")
        self.requests.append(f"{method} {path}")
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
        elif path.endswith("/json"):
            await self._answer(writer, 200, {"Running": False, "ExitCode": 3})
        elif "/archive" in path and method == "PUT":
            await self._answer(writer, 200, None)
        elif "/archive" in path:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            await writer.drain()
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, value: Any) -> None:
        body = b"" if value is None else json.dumps(value).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def scripted_engine(tmp_path: Path, output: list[bytes]) -> AsyncIterator[ScriptedEngine]:
    engine = ScriptedEngine(output)
    server = await asyncio.start_unix_server(engine.handle, path=str(tmp_path / "engine.sock"))
    async with server:
        yield engine


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
