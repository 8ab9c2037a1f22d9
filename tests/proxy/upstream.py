"""A fake model API on the host's loopback (OpenAI chat completions and Anthropic messages,
streamed and not), a real HTTP server for the model-proxy tests and benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import Any

from typing_extensions import Self

WORDS = ["Hel", "lo", " from", " up", "stream"]


class LoopbackServer:
    """An HTTP server on a free port of 127.0.0.1 for the length of an `async with`;
    `requests` records what it received."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class RecordingListener(LoopbackServer):
    """Answers any request with 200 "ok" and closes: where an attacker's host would be,
    or an upstream whose answers do not matter."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
        self.requests.append({"line": head[0], "headers": headers})
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()


class FakeUpstream(LoopbackServer):
    def __init__(self, delay: float = 0.05) -> None:
        super().__init__()
        self.delay = delay  # between streamed events
        self.stream_closed_early = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled at shutdown while a client keeps its connection: end quietly (Python
        # 3.11's stream callback would log a cancelled handler as an error).
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = {
                    k.lower(): v.strip()
                    for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append({"method": method, "path": path, "headers": headers})
                await self._answer(writer, path, headers, body)

    async def _answer(
        self, writer: asyncio.StreamWriter, path: str, headers: dict[str, str], body: bytes
    ) -> None:
        payload = json.loads(body) if body and path != "/v1/echo" else {}
        if path == "/v1/echo":
            digest = hashlib.sha256(body).hexdigest()
            auth = headers.get("authorization", "")
            return await self._json(writer, {"bytes": len(body), "sha256": digest, "auth": auth})
        if path == "/v1/chat/completions" and not payload.get("stream"):
            text = "".join(WORDS)
            return await self._json(
                writer,
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": payload.get("model", "fake"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                },
            )
        if path == "/v1/chat/completions":
            events = [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in WORDS]
            return await self._sse(writer, [json.dumps(e) for e in events] + ["[DONE]"])
        if path == "/v1/messages" and not payload.get("stream"):
            return await self._json(
                writer,
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "text", "text": "".join(WORDS)}],
                    "stop_reason": "end_turn",
                },
            )
        if path == "/v1/messages":
            events = [
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": w}}
                for w in WORDS
            ]
            return await self._sse(writer, [json.dumps(e) for e in events])
        if path == "/v1/endless":
            return await self._sse(writer, (f'{{"n": {n}}}' for n in range(600)))
        await self._json(writer, {"error": "no such path"}, status=404)

    @staticmethod
    async def _json(writer: asyncio.StreamWriter, payload: Any, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    async def _sse(self, writer: asyncio.StreamWriter, events: Any) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        try:
            for event in events:
                data = f"data: {event}\n\n".encode()
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
                await asyncio.sleep(self.delay)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self.stream_closed_early.set()
            raise
