"""`<runtime> model_proxy [--port 13131] [--timeout 300]`: HTTP inside the sandbox, answered
by the host.

An agent inside an offline sandbox calls its model API at http://127.0.0.1:13131 (an
OpenAI, Anthropic or Google SDK, a CLI such as Claude Code or Codex). Each request is
handed to the runtime server, which sends it to the host the moment it arrives; the
host's answer is written back as it comes, chunk by chunk (Server-Sent Events are not
held back). The tunnel knows nothing of model APIs: which dialect a path speaks is the
host handler's business.

HTTP/1.1 with keep-alive, `Content-Length` and chunked request bodies, concurrent
requests. Requests are parsed strictly (RFC 9112), before anything reaches the runtime
server: whatever two HTTP parsers could read differently (Content-Length with
Transfer-Encoding, two lengths, a coding other than exactly `chunked`, obs-fold, bare
CR or LF, a method or header name that is not a token, a malformed length or chunk size)
gets 400 (413 too large, 431 head too large, 501 unknown transfer coding, 505 another
HTTP version) and the connection is closed. A host that does not answer in time gets
504; a failing host handler, 502; all with a JSON error body. A client that disconnects
cancels the host's handler.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import sys
from typing import Any

from sandbox_tools.protocol import HOP_BY_HOP_HEADERS
from sandbox_tools.runtime.paths import ServerDirError, server_paths

DEFAULT_PORT = 13131
DEFAULT_TIMEOUT = 300.0
MAX_HEAD_BYTES = 64 * 1024
# One message to the host is at most 48 MiB as it travels; base64 makes 32 MiB 43 MiB.
MAX_BODY_BYTES = 32 * 1024 * 1024
READ_WAIT_MS = 30_000
DISCONNECT_CHECK_S = 0.1
# After refusing a request: how long, and how much, of the rest is read and dropped.
LINGER_S = 1.0
LINGER_BYTES = MAX_BODY_BYTES + MAX_HEAD_BYTES
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _ServerConnection:
    """One connection to the runtime server, newline-delimited JSON-RPC."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._ids = 0

    @classmethod
    async def open(cls, socket_path: str) -> _ServerConnection:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=80 * 1024 * 1024)
        return cls(reader, writer)

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self._ids += 1
        request = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        self.writer.write(json.dumps(request).encode() + b"\n")
        await self.writer.drain()
        line = await self.reader.readline()
        if not line:
            raise ConnectionError("the runtime server closed the connection")
        response = json.loads(line)
        if "error" in response:
            raise RuntimeError(str(response["error"].get("message")))
        return response.get("result")

    def close(self) -> None:
        self.writer.close()


# RFC 9110 5.6.2: a token is 1*tchar.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")
# Visible ASCII only: no spaces, controls, fragments or raw non-ASCII in a target.
_TARGET = re.compile(r"/[\x21-\x22\x24-\x7e]*")
# A field value: visible characters, spaces and tabs, obs-text; no other control.
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_DIGITS = re.compile(r"[0-9]+")
# chunk-size [chunk-ext]: hex digits, then extensions we read past (RFC 9112 7.1.1).
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]+)((?:[ \t]*;[\t\x20-\x7e\x80-\xff]*)?)\r\n")
MAX_LENGTH_DIGITS = 15  # a length with more digits is far past MAX_BODY_BYTES
MAX_HEADERS = 256


class Request:
    __slots__ = ("headers", "keep_alive", "method", "target", "version")

    def __init__(
        self, method: str, target: str, version: tuple[int, int], headers: list[list[str]]
    ) -> None:
        self.method, self.target, self.version, self.headers = method, target, version, headers
        tokens = {t.strip().lower() for v in self.values("connection") for t in v.split(",")}
        self.keep_alive = "close" not in tokens and (version >= (1, 1) or "keep-alive" in tokens)

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name]


def _field(line: str) -> list[str]:
    """One field line, strictly (RFC 9112 5): a token, a colon, a clean value."""
    if line[:1] in (" ", "\t"):
        raise BadRequest("obsolete line folding is not accepted")
    name, sep, value = line.partition(":")
    if not sep or not _TOKEN.fullmatch(name):
        raise BadRequest(f"malformed header line {line[:100]!r}")
    value = value.strip(" \t")
    if not _FIELD_VALUE.fullmatch(value):
        raise BadRequest(f"header {name[:100]!r} holds a control character")
    return [name, value]


async def _read_head(reader: asyncio.StreamReader) -> Request | None:
    head = b""
    try:
        for _ in range(4):
            # Empty lines before a request line are ignored (RFC 9112 2.2), a few of them.
            head = (await reader.readuntil(b"\r\n\r\n")).lstrip(b"\r\n")
            if head:
                break
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None  # the client closed a kept-alive connection
        raise BadRequest("incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(f"request head larger than {MAX_HEAD_BYTES} bytes", 431) from None
    if not head:
        raise BadRequest("no request line")
    lines = head[:-4].decode("latin-1").split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise BadRequest("a line of the request head ends in a bare CR or LF")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise BadRequest(f"malformed request line {lines[0][:100]!r}")
    method, target, version_text = parts
    if not _TOKEN.fullmatch(method):
        raise BadRequest(f"malformed method {method[:100]!r}")
    version = _VERSION.fullmatch(version_text)
    if version is None:
        raise BadRequest(f"malformed HTTP version {version_text[:100]!r}")
    if version.group(1) != "1":
        raise BadRequest(f"HTTP version {version_text} is not supported", 505)
    if not _TARGET.fullmatch(target):
        raise BadRequest(f"unsupported request target {target[:100]!r} (origin form only)")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(f"more than {MAX_HEADERS} header lines", 431)
    request = Request(
        method, target, (1, int(version.group(2))), [_field(line) for line in lines[1:]]
    )
    hosts = request.values("host")
    if len(hosts) > 1 or (not hosts and request.version >= (1, 1)):
        raise BadRequest("an HTTP/1.1 request needs exactly one Host header")
    return request


def _body_length(request: Request) -> int | None:
    """The body's framing (RFC 9112 6): its length, or None for chunked.

    Anything two parties could read differently is refused: Content-Length together
    with Transfer-Encoding, more than one length, any coding but exactly `chunked`.
    """
    encodings = request.values("transfer-encoding")
    lengths = request.values("content-length")
    if encodings:
        if lengths:
            raise BadRequest("Content-Length and Transfer-Encoding together are not accepted")
        if request.version < (1, 1):
            raise BadRequest("Transfer-Encoding in an HTTP/1.0 request")
        codings = [c.strip(" \t") for v in encodings for c in v.split(",")]
        names = [c.split(";")[0].strip(" \t").lower() for c in codings]
        if not all(_TOKEN.fullmatch(n) for n in names):
            raise BadRequest(f"malformed Transfer-Encoding {', '.join(encodings)[:100]!r}")
        if names[-1] != "chunked" or names.count("chunked") > 1 or ";" in codings[-1]:
            # Chunked must be the last coding, once, without parameters; else the body's
            # end cannot be found.
            raise BadRequest(f"unsupported Transfer-Encoding {', '.join(encodings)[:100]!r}")
        if len(names) > 1:
            raise BadRequest(
                f"transfer coding {', '.join(names[:-1])[:100]!r} is not implemented", 501
            )
        return None
    if not lengths:
        return 0
    if len(lengths) > 1 or not _DIGITS.fullmatch(lengths[0]):
        raise BadRequest(f"malformed Content-Length {', '.join(lengths)[:100]!r}")
    if len(lengths[0]) > MAX_LENGTH_DIGITS or int(lengths[0]) > MAX_BODY_BYTES:
        raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes", 413)
    return int(lengths[0])


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise BadRequest("chunk size line too long") from None
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None:
            raise BadRequest(f"malformed chunk size line {line[:40]!r}")
        digits = match.group(1).lstrip(b"0") or b"0"
        if len(digits) > MAX_LENGTH_DIGITS:
            raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes", 413)
        size = int(digits, 16)
        if size == 0:
            break
        if len(body) + size > MAX_BODY_BYTES:
            raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes", 413)
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest("a chunk's data is not followed by CRLF")
    trailers = 0
    while True:  # trailer fields: checked, bounded, not forwarded
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise BadRequest(f"trailer section larger than {MAX_HEAD_BYTES} bytes", 431) from None
        if line == b"\r\n":
            return bytes(body)
        trailers += len(line)
        if trailers > MAX_HEAD_BYTES:
            raise BadRequest(f"trailer section larger than {MAX_HEAD_BYTES} bytes", 431)
        text = line[:-2].decode("latin-1")
        if "\r" in text or "\n" in text:
            raise BadRequest("a trailer line ends in a bare CR or LF")
        _field(text)


async def _read_body(reader: asyncio.StreamReader, request: Request) -> bytes:
    length = _body_length(request)
    if length is None:
        return await _read_chunked(reader)
    return await reader.readexactly(length)


async def _reject(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, message: str
) -> None:
    """Answer a request that is refused, then close the connection gracefully.

    The rest of what the client sends is read and dropped for a moment first (bounded):
    closing with unread data resets the connection, and a reset can destroy the answer
    before the client reads it.
    """
    with contextlib.suppress(Exception):
        writer.write(_error_response(status, message, keep_alive=False))
        await asyncio.wait_for(writer.drain(), LINGER_S)
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(_discard(reader), LINGER_S)


async def _discard(reader: asyncio.StreamReader) -> None:
    dropped = 0
    while dropped < LINGER_BYTES and (data := await reader.read(64 * 1024)):
        dropped += len(data)


def _error_response(status: int, message: str, keep_alive: bool) -> bytes:
    body = json.dumps({"error": {"type": "sandbox_tools_proxy", "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


class ModelProxy:
    def __init__(self, socket_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def handle_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            request = await _read_head(reader)
            if request is None:
                return False
            body = await _read_body(reader, request)
        except BadRequest as exc:
            await _reject(reader, writer, exc.status, str(exc))
            return False
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            await _reject(reader, writer, 400, "the request ended early or is malformed")
            return False
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:  # never a silent drop: whatever was not foreseen is a 400
            await _reject(reader, writer, 400, f"malformed request ({type(exc).__name__})")
            return False
        try:
            server = await _ServerConnection.open(self.socket_path)
        except OSError as exc:
            writer.write(
                _error_response(
                    502, f"the runtime server is not reachable: {exc.strerror or exc}", False
                )
            )
            await writer.drain()
            return False
        try:
            return (
                await self._forward(
                    server, reader, writer, request.method, request.target, request.headers, body
                )
                and request.keep_alive
            )
        finally:
            server.close()

    async def _forward(
        self,
        server: _ServerConnection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        headers: list[list[str]],
        body: bytes,
    ) -> bool:
        request = {
            "method": method,
            "path": target,
            "headers": headers,
            "body": base64.b64encode(body).decode("ascii"),
            "timeout": self.timeout,
        }
        opened = asyncio.create_task(server.call("http_tunnel_open", request))
        if not await self._until_done_or_gone(opened, reader):
            return False  # the client left: the server cancels the exchange for the host
        try:
            head = opened.result()
        except RuntimeError as exc:
            text = str(exc)
            status = 504 if "did not answer" in text else 413 if "larger than" in text else 502
            writer.write(_error_response(status, str(exc), keep_alive=True))
            await writer.drain()
            return True
        request_id = head["request_id"]
        lines = [f"HTTP/1.1 {head['status']} {REASONS.get(head['status'], 'Status')}"]
        lines += [f"{k}: {v}" for k, v in head["headers"] if k.lower() not in HOP_BY_HOP_HEADERS]
        lines += ["Transfer-Encoding: chunked", "Connection: keep-alive", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1"))
        try:
            while True:
                read = asyncio.create_task(
                    server.call(
                        "http_tunnel_read", {"request_id": request_id, "wait_ms": READ_WAIT_MS}
                    )
                )
                if not await self._until_done_or_gone(read, reader):
                    await self._cancel(request_id)
                    return False
                result = read.result()
                for chunk in result["chunks"]:
                    data = base64.b64decode(chunk)
                    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
                if result["done"]:
                    if result.get("error"):
                        return False  # the host's handler failed mid-body: cut the response
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return True
        except ConnectionError:
            await self._cancel(request_id)
            return False

    async def _until_done_or_gone(
        self, task: asyncio.Task[Any], reader: asyncio.StreamReader
    ) -> bool:
        """Wait for `task`; False (and the task cancelled) if the client disconnects first."""
        while not task.done():
            await asyncio.wait([task], timeout=DISCONNECT_CHECK_S)
            if not task.done() and reader.at_eof():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                return False
        return True

    async def _cancel(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            server = await _ServerConnection.open(self.socket_path)
            try:
                await server.call("http_tunnel_cancel", {"request_id": request_id})
            finally:
                server.close()


def run(argv: list[str]) -> int:
    port, timeout = DEFAULT_PORT, DEFAULT_TIMEOUT
    args = list(argv)
    try:
        while args:
            flag = args.pop(0)
            if flag == "--port":
                port = int(args.pop(0))
            elif flag == "--timeout":
                timeout = float(args.pop(0))
            else:
                raise ValueError(flag)
    except (ValueError, IndexError):
        print("usage: model_proxy [--port N] [--timeout SECONDS]", file=sys.stderr)
        return 2
    try:
        paths = server_paths()
    except ServerDirError as exc:
        print(f"model_proxy: {exc}", file=sys.stderr)
        return 1
    proxy = ModelProxy(paths.socket, timeout)

    async def serve() -> int:
        try:
            server = await asyncio.start_server(
                proxy.handle_client, "127.0.0.1", port, limit=MAX_HEAD_BYTES
            )
        except OSError as exc:
            print(
                f"model_proxy: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}; "
                "choose another port with --port",
                file=sys.stderr,
            )
            return 1
        print(f"model_proxy listening on http://127.0.0.1:{port}", flush=True)
        async with server:
            await server.serve_forever()
        return 0

    try:
        return asyncio.run(serve())
    except KeyboardInterrupt:
        return 130
