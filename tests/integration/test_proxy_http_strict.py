"""The in-sandbox model proxy parses HTTP/1.1 strictly (RFC 9112), over a real socket.

The agent is untrusted and talks to the proxy directly: a request two HTTP parsers could
frame differently (request smuggling), or one the proxy cannot read, is refused with a
JSON error and the connection closed, before anything reaches the runtime server. A
fake runtime server on a Unix socket counts the requests that do reach it and answers
them by echoing what the proxy forwarded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.runtime.model_proxy import MAX_BODY_BYTES, MAX_HEAD_BYTES, ModelProxy

pytestmark = pytest.mark.timeout(120)


@dataclass
class FakeRuntime:
    """Answers http_tunnel_open/read as the runtime server would, echoing the request."""

    socket: str
    forwarded: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = b""
        while line := await reader.readline():
            call = json.loads(line)
            if call["method"] == "http_tunnel_open":
                params = call["params"]
                self.forwarded.append(params)
                body = json.dumps(
                    {
                        "method": params["method"],
                        "path": params["path"],
                        "body": base64.b64decode(params["body"]).decode("latin-1"),
                    }
                ).encode()
                result: Any = {"request_id": "r1", "status": 200, "headers": []}
            else:
                result = {"chunks": [base64.b64encode(body).decode()], "done": True}
            response = {"jsonrpc": "2.0", "id": call["id"], "result": result}
            writer.write(json.dumps(response).encode() + b"\n")
            await writer.drain()
        writer.close()


@dataclass
class Proxy:
    port: int
    runtime: FakeRuntime


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    with tempfile.TemporaryDirectory(prefix="st-proxy-", dir="/tmp") as directory:
        runtime = FakeRuntime(str(Path(directory, "s")))
        unix = await asyncio.start_unix_server(runtime.handle, runtime.socket)
        model_proxy = ModelProxy(runtime.socket, timeout=10)
        tcp = await asyncio.start_server(
            model_proxy.handle_client, "127.0.0.1", 0, limit=MAX_HEAD_BYTES
        )
        port = tcp.sockets[0].getsockname()[1]
        try:
            yield Proxy(port, runtime)
        finally:
            tcp.close()
            unix.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the proxy closed the connection after it


async def exchange(port: int, raw: bytes, read_all: bool = True) -> Answer:
    """Send `raw`, read one response (and, if asked, wait for the connection to close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in filter(None, lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:  # chunked (an answer forwarded from the runtime)
            body = b""
            while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readexactly(2)
        closed = False
        if read_all:
            closed = await asyncio.wait_for(reader.read(1), 10) == b""
        return Answer(int(status_line.split(" ")[1]), headers, body, closed)
    finally:
        writer.close()


def post(headers: str, body: bytes = b"", version: str = "HTTP/1.1") -> bytes:
    return f"POST /v1/chat {version}\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode("latin-1") + body


REFUSED = [
    # Framing two parsers could read differently (request smuggling).
    ("cl-and-te", post("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), 400),
    ("te-and-cl", post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", b"0\r\n\r\n"), 400),
    ("cl-twice-same", post("Content-Length: 5\r\nContent-Length: 5\r\n", b"hello"), 400),
    ("cl-twice-differing", post("Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!"), 400),
    ("cl-list", post("Content-Length: 5, 5\r\n", b"hello"), 400),
    ("te-xchunkedx", post("Transfer-Encoding: xchunkedx\r\n", b"0\r\n\r\n"), 400),
    ("te-chunked-twice", post("Transfer-Encoding: chunked, chunked\r\n", b"0\r\n\r\n"), 400),
    (
        "te-two-lines",
        post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
        400,
    ),
    ("te-not-last", post("Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n"), 400),
    ("te-chunked-params", post("Transfer-Encoding: chunked;x=1\r\n", b"0\r\n\r\n"), 400),
    ("te-empty-element", post("Transfer-Encoding: , chunked\r\n", b"0\r\n\r\n"), 400),
    ("te-identity", post("Transfer-Encoding: identity\r\n", b""), 400),
    ("te-gzip-chunked", post("Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"), 501),
    ("te-in-http-1.0", post("Transfer-Encoding: chunked\r\n", b"0\r\n\r\n", "HTTP/1.0"), 400),
    # Lengths.
    ("cl-sign", post("Content-Length: +5\r\n", b"hello"), 400),
    ("cl-negative", post("Content-Length: -1\r\n"), 400),
    ("cl-hex", post("Content-Length: 0x5\r\n", b"hello"), 400),
    ("cl-letters", post("Content-Length: 5a\r\n", b"hello"), 400),
    ("cl-empty", post("Content-Length: \r\n"), 400),
    ("cl-underscore", post("Content-Length: 1_0\r\n", b"0123456789"), 400),
    ("cl-superscript-digit", post("Content-Length: \xb2\r\n", b"hi"), 400),
    ("cl-huge", post("Content-Length: 99999999999999999999999\r\n"), 413),
    ("cl-5000-digits", post(f"Content-Length: {'9' * 5000}\r\n"), 413),
    ("cl-over-limit", post(f"Content-Length: {MAX_BODY_BYTES + 1}\r\n"), 413),
    # Chunk sizes and chunk framing.
    ("chunk-negative", post("Transfer-Encoding: chunked\r\n", b"-1\r\nx\r\n0\r\n\r\n"), 400),
    ("chunk-0x", post("Transfer-Encoding: chunked\r\n", b"0x5\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-plus", post("Transfer-Encoding: chunked\r\n", b"+5\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-space", post("Transfer-Encoding: chunked\r\n", b" 5\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-underscore", post("Transfer-Encoding: chunked\r\n", b"1_0\r\n" + b"x" * 16), 400),
    ("chunk-not-hex", post("Transfer-Encoding: chunked\r\n", b"zz\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-empty-size", post("Transfer-Encoding: chunked\r\n", b"\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-bare-lf", post("Transfer-Encoding: chunked\r\n", b"5\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-huge", post("Transfer-Encoding: chunked\r\n", b"f" * 40 + b"\r\nx\r\n"), 413),
    ("chunk-no-crlf", post("Transfer-Encoding: chunked\r\n", b"5\r\nhelloXY0\r\n\r\n"), 400),
    ("trailer-fold", post("Transfer-Encoding: chunked\r\n", b"0\r\nA: b\r\n c\r\n\r\n"), 400),
    ("trailer-no-colon", post("Transfer-Encoding: chunked\r\n", b"0\r\nnonsense\r\n\r\n"), 400),
    # Field lines.
    ("obs-fold", post("X-Note: one\r\n  two\r\n"), 400),
    ("obs-fold-tab", post("X-Note: one\r\n\ttwo\r\n"), 400),
    ("space-before-colon", post("Content-Length : 5\r\n", b"hello"), 400),
    ("name-with-space", post("Bad Header: x\r\n"), 400),
    ("name-not-token", post("X(a): b\r\n"), 400),
    ("name-empty", post(": b\r\n"), 400),
    ("name-non-ascii", post("X-\xe9: b\r\n"), 400),
    ("value-nul", post("X-A: a\x00b\r\n"), 400),
    ("value-control", post("X-A: a\x1bb\r\n"), 400),
    ("bare-lf-in-head", b"POST /v1/chat HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n", 400),
    ("bare-cr-in-head", b"POST /v1/chat HTTP/1.1\r\nHost: x\rX-A: b\r\n\r\n", 400),
    ("no-host", b"POST /v1/chat HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
    ("two-hosts", post("Host: other\r\n"), 400),
    # Request lines.
    ("method-not-token", b"G@T /v1 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("method-non-ascii", b"G\xc9T /v1 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("method-empty", b" /v1 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("double-space", b"GET  /v1 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("target-not-origin", b"GET http://x/v1 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("target-non-ascii", b"GET /v\xe91 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ("version-garbage", b"GET /v1 HTTP/1.1x\r\nHost: x\r\n\r\n", 400),
    ("version-2", b"GET /v1 HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ("not-http", b"THIS IS NOT HTTP\r\n\r\n", 400),
    ("head-too-large", post(f"X-Big: {'a' * MAX_HEAD_BYTES}\r\n"), 431),
]


@pytest.mark.security
@pytest.mark.parametrize(("raw", "status"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_a_malformed_request_is_refused_with_json_and_the_connection_closed(
    proxy: Proxy, raw: bytes, status: int
) -> None:
    """THREAT_MODEL.md, "everything read from a sandbox is data, parsed strictly": the
    proxy accepted Content-Length with Transfer-Encoding, two Content-Lengths,
    `Transfer-Encoding: xchunkedx`, obs-fold and non-token names and methods (requests
    a second parser would frame differently), and some malformed lengths (`-1`, `²`,
    5000 digits) dropped the connection with no response at all."""
    answer = await exchange(proxy.port, raw)
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["connection"] == "close"
    assert json.loads(answer.body)["error"]["message"]
    assert answer.closed
    assert proxy.runtime.forwarded == []  # refused before it reached the runtime server


ACCEPTED = [
    ("content-length", post("Content-Length: 5\r\n", b"hello"), "hello"),
    ("no-body", b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n", ""),
    ("http-1.0-no-host", b"GET /v1/models HTTP/1.0\r\n\r\n", ""),
    ("leading-zeros", post("Content-Length: 005\r\n", b"hello"), "hello"),
    (
        "chunked-upper-case",
        post("Transfer-Encoding: CHUNKED\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
        "hello",
    ),
    (
        "chunked-extensions-trailers",
        post(
            "Transfer-Encoding:  chunked \r\n",
            b"5;name=value\r\nhello\r\n06 ; x\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        ),
        "hello world",
    ),
    ("obs-text-value", post("X-Note: caf\xe9\r\nContent-Length: 2\r\n", b"ok"), "ok"),
    ("empty-line-first", b"\r\n" + post("Content-Length: 2\r\n", b"ok"), "ok"),
]


@pytest.mark.parametrize(("raw", "body"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
async def test_well_formed_requests_still_reach_the_runtime(
    proxy: Proxy, raw: bytes, body: str
) -> None:
    answer = await exchange(proxy.port, raw, read_all=False)
    assert answer.status == 200, answer
    assert json.loads(answer.body)["body"] == body
    assert len(proxy.runtime.forwarded) == 1


@pytest.mark.security
async def test_a_rejected_request_ends_a_kept_alive_connection(proxy: Proxy) -> None:
    """THREAT_MODEL.md, "parsed strictly": after a refusal nothing more is read from the
    connection as a request (what follows a request of unknown length is no request)."""
    good = post("Content-Length: 2\r\n", b"ok")
    smuggled = post("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n") + good
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(good + smuggled)
        await writer.drain()
        everything = await asyncio.wait_for(reader.read(), 10)  # to the end: it was closed
    finally:
        writer.close()
    assert everything.startswith(b"HTTP/1.1 200 ")
    assert everything.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 400 " in everything
    assert len(proxy.runtime.forwarded) == 1
