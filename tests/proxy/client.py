"""An HTTP client run inside the sandbox (python3's standard library only), one scenario
per argument; prints JSON for the test to check."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
import time

PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 13131


def post(path: str, payload: object, stream: bool = False) -> tuple[int, list[tuple[float, str]]]:
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    started = time.monotonic()
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    connection.request(
        "POST",
        path,
        body,
        {"Content-Type": "application/json", "Authorization": "Bearer sandbox-secret"},
    )
    response = connection.getresponse()
    pieces: list[tuple[float, str]] = []
    if stream:
        for line in response:
            text = line.decode().strip()
            if text.startswith("data:"):
                pieces.append((time.monotonic() - started, text[5:].strip()))
    else:
        pieces.append((time.monotonic() - started, response.read().decode()))
    connection.close()
    return response.status, pieces


def main() -> None:
    scenario = sys.argv[1]
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if scenario == "chat":
        print(json.dumps(post("/v1/chat/completions", chat)))
    elif scenario == "chat-stream":
        print(json.dumps(post("/v1/chat/completions", {**chat, "stream": True}, stream=True)))
    elif scenario == "messages":
        print(json.dumps(post("/v1/messages", {**chat, "max_tokens": 5})))
    elif scenario == "messages-stream":
        payload = {**chat, "max_tokens": 5, "stream": True}
        print(json.dumps(post("/v1/messages", payload, stream=True)))
    elif scenario == "big":
        print(json.dumps(post("/v1/echo", b"x" * (5 * 1024 * 1024))))
    elif scenario == "concurrent":
        results: list[object] = []
        threads = [
            threading.Thread(target=lambda: results.append(post("/v1/chat/completions", chat)))
            for _ in range(16)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(json.dumps({"results": results, "seconds": time.monotonic() - started}))
    elif scenario == "disconnect":
        raw = socket.create_connection(("127.0.0.1", PORT))
        raw.sendall(
            b"POST /v1/endless HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 0\r\n\r\n" % PORT
        )
        first = raw.recv(4096)
        raw.close()
        print(json.dumps({"first": first.decode(errors="replace")[:200]}))
    elif scenario == "bench":  # latency of plain requests, time to the first streamed event
        runs = int(sys.argv[3])
        latency = [post("/v1/chat/completions", chat)[1][0][0] * 1000 for _ in range(runs)]
        stream = {**chat, "stream": True}
        ttft = [
            post("/v1/chat/completions", stream, stream=True)[1][0][0] * 1000 for _ in range(runs)
        ]
        print(json.dumps({"latency_ms": latency, "ttft_ms": ttft}))
    elif scenario == "malformed":
        raw = socket.create_connection(("127.0.0.1", PORT))
        raw.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        answer = raw.recv(4096).decode(errors="replace")
        raw.close()
        print(json.dumps({"answer": answer}))


main()
