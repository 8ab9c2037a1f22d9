"""`<runtime> model_proxy [--port 13131] [--timeout 300]`: HTTP inside the sandbox, answered
by the host.

An agent inside an offline sandbox calls its model API at http://127.0.0.1:13131 (an
OpenAI, Anthropic or Google SDK, a CLI such as Claude Code or Codex). Each request is
handed to the runtime server, which sends it to the host the moment it arrives; the
host's answer is written back as it comes, chunk by chunk (Server-Sent Events are not
held back). The tunnel knows nothing of model APIs: which dialect a path speaks is the
host handler's business.

HTTP/1.1 with keep-alive, `Content-Length` and chunked request bodies, concurrent
requests; a malformed request gets 400 and the connection is closed; a host that does
not answer in time, 504; a failing host handler, 502; all with a JSON error body. A
client that disconnects cancels the host's handler.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from typing import Any

from sandbox_tools.protocol import HOP_BY_HOP_HEADERS
from sandbox_tools.runtime.paths import ServerDirError, server_paths

DEFAULT_PORT = 13131
DEFAULT_TIMEOUT = 300.0
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 48 * 1024 * 1024  # a frame to the server is 64 MiB, base64 included
READ_WAIT_MS = 30_000
DISCONNECT_CHECK_S = 0.1
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    413: "Payload Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    504: "Gateway Timeout",
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


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, list[list[str]]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None  # the client closed a kept-alive connection
        raise BadRequest("incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(f"request head larger than {MAX_HEAD_BYTES} bytes") from None
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise BadRequest("malformed request line") from None
    if not version.startswith("HTTP/1.") or not method.isalpha() or not target.startswith("/"):
        raise BadRequest(f"unsupported request line {lines[0][:100]!r}")
    headers: list[list[str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"malformed header line {line[:100]!r}")
        headers.append([name, value.strip()])
    return method, target, headers


def _header(headers: list[list[str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


async def _read_body(reader: asyncio.StreamReader, headers: list[list[str]]) -> bytes:
    encoding = (_header(headers, "transfer-encoding") or "").lower()
    if "chunked" in encoding:
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadRequest("malformed chunk size") from None
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers: ignored
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes", 413)
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise BadRequest("malformed chunk")
    length_text = _header(headers, "content-length")
    if length_text is None:
        return b""
    if not length_text.isdigit():
        raise BadRequest(f"malformed Content-Length {length_text[:40]!r}")
    length = int(length_text)
    if length > MAX_BODY_BYTES:
        raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes", 413)
    return await reader.readexactly(length)


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
            parsed = await _read_head(reader)
            if parsed is None:
                return False
            method, target, headers = parsed
            body = await _read_body(reader, headers)
        except BadRequest as exc:
            writer.write(_error_response(exc.status, str(exc), keep_alive=False))
            await writer.drain()
            return False
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.write(_error_response(400, "the request ended early or is malformed", False))
            await writer.drain()
            return False
        keep_alive = (_header(headers, "connection") or "").lower() != "close"
        server = await _ServerConnection.open(self.socket_path)
        try:
            return (
                await self._forward(server, reader, writer, method, target, headers, body)
                and keep_alive
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
            status = 504 if "did not answer" in str(exc) else 502
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
