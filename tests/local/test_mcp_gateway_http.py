"""`tools mcp --http`: the streamable HTTP transport on loopback, with real processes and
sockets (no container: the tools are listed, none is called). A client without the
token, with another Host (DNS rebinding), or at another path is refused; one with it
gets the same tools as on stdio through the SDK's own HTTP client; SIGTERM ends the
server cleanly; a token file others can read, or a short token, stops it from starting."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from sandbox_tools.mcp_gateway.server import HEAD_TIMEOUT
from tests.support import SRC

TOKEN = "t0ken-" + "x" * 40


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def token_file(tmp_path: Path, token: str = TOKEN, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def start(port: int, token: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as errlog:
        return subprocess.Popen(
            [sys.executable, "-m", "sandbox_tools.cli", "mcp", "--http", str(port),
             "--token-file", str(token)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog,
            env={**os.environ, "PYTHONPATH": SRC},
        )  # fmt: skip


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    port, log = free_port(), tmp_path / "stderr.log"
    server = start(port, token_file(tmp_path), log)
    try:
        deadline = time.monotonic() + 60
        while "serving MCP on" not in log.read_text():
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield port, server, log
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_only_a_client_with_the_token_and_this_host_reaches_the_tools(
    served: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    port, server, log = served
    url = f"http://127.0.0.1:{port}/mcp"
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    assert httpx.post(url, json=hello, headers=accept).status_code == 401
    wrong = {**accept, "Authorization": "Bearer " + "y" * 46}
    assert httpx.post(url, json=hello, headers=wrong).status_code == 401
    bearer = {**accept, "Authorization": f"Bearer {TOKEN}"}
    elsewhere = f"http://127.0.0.1:{port}/other"
    assert httpx.post(elsewhere, json=hello, headers=bearer).status_code == 404
    rebound = httpx.post(url, json=hello, headers={**bearer, "Host": f"evil.example:{port}"})
    assert rebound.status_code in (403, 421), rebound.text
    page = httpx.post(url, json=hello, headers={**bearer, "Origin": "http://evil.example"})
    assert page.status_code == 403, page.text

    async def listed() -> set[str]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx.AsyncClient(headers=headers) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return {tool.name for tool in (await session.list_tools()).tools}

    tools = asyncio.run(listed())
    assert {"sandbox_create", "bash", "browser_navigate"} <= tools
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    said = log.read_text()
    assert "closed 0 sandbox(es)" in said and "Traceback" not in said, said[-3000:]


def test_connections_that_never_send_a_request_are_bounded_and_closed(
    served: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    """Any local user can open connections to the port: 600 that never send a request
    head (the attacker walk's 1,500 used up the server's file descriptors, and logged a
    traceback for every accept that failed). Past MAX_HTTP_CONNECTIONS they are closed
    at once, the rest after HEAD_TIMEOUT; then the client with the token is served."""
    port, server, log = served
    idle = []
    for _ in range(600):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        idle.append(connection)
    try:
        deadline = time.monotonic() + HEAD_TIMEOUT + 20
        closed = 0
        for connection in idle:  # each ends with EOF (or a reset) from the server
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                closed += connection.recv(1024) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
        assert closed == len(idle)
    finally:
        for connection in idle:
            connection.close()
    hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TOKEN}"}
    answer = httpx.post(f"http://127.0.0.1:{port}/mcp", json=hello, headers=headers)
    assert answer.status_code != 401 and server.poll() is None
    assert log.stat().st_size < 100_000, log.read_text()[-3000:]


@pytest.mark.parametrize(
    ("token", "mode", "said"),
    [
        (TOKEN, 0o644, "can be read by others"),
        ("short", 0o600, "at least 32 printable characters"),
    ],
)
def test_a_token_others_can_read_or_guess_stops_the_server_from_starting(
    tmp_path: Path, token: str, mode: int, said: str
) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", "mcp", "--http", str(free_port()),
         "--token-file", str(token_file(tmp_path, token, mode))],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
