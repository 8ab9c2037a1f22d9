"""Attacks on the model proxy from an outside review, each a test: a method that makes
the upstream echo the host's credentials, dense JSON that costs the host gigabytes once
parsed, streams the agent abandons, and refusals that fill the host's log. The attacker
is the agent's HTTP client of the in-sandbox proxy, or a client of the runtime socket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from sandbox_tools.injector.jsonrpc_client import StdioRuntimeClient
from sandbox_tools.injector.model_proxy import (
    MAX_REQUEST_JSON_VALUES,
    REFUSALS_LOGGED,
    ModelProxy,
    ProxyRequest,
    ProxyResponse,
    forward_to,
)
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.sandboxes.local import LocalSandbox
from tests.proxy.upstream import RecordingListener
from tests.support import RuntimeDir, free_port, peak_rss_mib

pytest.importorskip("httpx", reason="the [proxy] extra is not installed")
pytestmark = [pytest.mark.security, pytest.mark.timeout(300)]

HOST_TOKEN = "Bearer host-only-token"


class Runtime:
    """The runtime from this checkout over the persistent channel, as ModelProxy needs it."""

    def __init__(self, runtime_dir: RuntimeDir) -> None:
        launch = local_source_runtime(runtime_dir.path)
        self.command, self.env = launch.command, launch.env
        self.client = StdioRuntimeClient(LocalSandbox(), launch.command, env=launch.env)


@pytest.fixture
async def runtime(runtime_dir: RuntimeDir) -> AsyncIterator[Runtime]:
    made = Runtime(runtime_dir)
    yield made
    await made.client.aclose()


async def raw_http(port: int, request: bytes, timeout: float = 60) -> bytes:
    """One request to the in-sandbox proxy, as the agent's own client sends it: `Host: x`
    stands for the proxy's own address, which every SDK sends (the host refuses others)."""
    request = request.replace(b"Host: x\r\n", b"Host: 127.0.0.1:%d\r\n" % port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), timeout)
    writer.close()
    return answer


async def test_methods_that_echo_or_tunnel_never_reach_the_upstream(
    runtime: Runtime, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rule 4: TRACE makes an upstream (Apache's default) echo the
    request, the host's Authorization included, back to the agent. Only the methods a
    model API takes are forwarded; the others are refused with 405 before any handler,
    through the proxy and straight through the tunnel."""
    port = free_port()
    async with RecordingListener() as upstream:
        handler = forward_to(upstream.url, headers={"Authorization": HOST_TOKEN})
        async with ModelProxy(runtime, handler, port=port, timeout=30):
            for method in (b"TRACE", b"TRACK", b"DEBUG", b"PROPFIND", b"get"):
                answer = await raw_http(port, method + b" /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 405"), (method, answer[:200])
                assert b"host-only-token" not in answer
            attacker = StdioRuntimeClient(LocalSandbox(), runtime.command, env=runtime.env)
            try:
                head = await attacker.call(
                    "http_tunnel_open",
                    {"method": "TRACE", "path": "/models", "headers": [], "body": ""},
                    timeout=60,
                )
                assert head["status"] == 405, head
            finally:
                await attacker.aclose()
            assert (await raw_http(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(
                b"HTTP/1.1 200"
            )
    assert [r["line"] for r in upstream.requests] == ["GET /v1/models HTTP/1.1"]


async def test_forward_to_refuses_such_methods_from_any_caller() -> None:
    """The handler checks too: it may be given requests built elsewhere."""
    from sandbox_tools.injector.model_proxy import ProxyRequestRefused

    handler = forward_to("http://127.0.0.1:9/v1", headers={"Authorization": HOST_TOKEN})
    try:
        with pytest.raises(ProxyRequestRefused) as refused:
            await handler(ProxyRequest("TRACE", "/models", [], b""))
        assert refused.value.status == 405
    finally:
        await handler.aclose()


def dense(values: int) -> bytes:
    return b'{"messages":[],"pad":[' + b",".join([b"{}"] * values) + b"]}"


async def test_dense_json_is_counted_by_what_it_costs_parsed(
    runtime: Runtime, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rule 3: a body of millions of tiny JSON values costs the host ten
    times its bytes once parsed. Requests are held by what they may cost parsed, so a
    dense body over the budget is answered 503 without reaching the handler, and a
    handler's `request.json()` refuses a body of more values than a model request
    needs (413) without parsing it."""
    handled: list[int] = []
    release = asyncio.Event()

    async def slow(request: ProxyRequest) -> ProxyResponse:
        handled.append(len(request.body))
        if len(request.body) < 10_000_000:
            request.json()  # the small dense body: refused by value count, unparsed
        await release.wait()
        return ProxyResponse.json({"ok": True})

    port = free_port()
    before = peak_rss_mib()
    async with ModelProxy(runtime, slow, port=port, timeout=60):
        big = dense(4_000_000)  # 12 MB of bytes, about 380 MB parsed
        answers = await asyncio.gather(
            *(
                raw_http(
                    port,
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                    % len(big)
                    + big,
                )
                for _ in range(3)
            )
        )
        small = dense(MAX_REQUEST_JSON_VALUES + 10)
        refused = await raw_http(
            port,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(small)
            + small,
        )
        release.set()
    assert all(a.startswith(b"HTTP/1.1 503") for a in answers), [a[:120] for a in answers]
    assert refused.startswith(b"HTTP/1.1 413"), refused[:200]
    assert handled == [len(small)]  # the big ones never reached the handler
    assert peak_rss_mib() - before < 400  # was over 1 GB for one parsed request


async def test_an_abandoned_stream_gives_its_slot_and_its_upstream_back(
    runtime: Runtime, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rules 3 and 6: the agent asks for a streamed answer, reads
    nothing, and is cut off at the proxy's timeout. The host's task ends (it waited for
    good on a full queue before), its handler slot is free for the next request, and
    the upstream connection is closed at once, not when the collector runs."""
    open_streams = 0

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_streams
        head = await reader.readuntil(b"\r\n\r\n")
        if b"/fast" in head.split(b"\r\n")[0]:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()
            return
        open_streams += 1
        try:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            event = b"data: " + b"x" * 16000 + b"\n\n"
            for _ in range(100_000):
                writer.write(b"%x\r\n" % len(event) + event + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0.001)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            open_streams -= 1

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = server.sockets[0].getsockname()[1]
    port = free_port()
    handler = forward_to(f"http://127.0.0.1:{up_port}", headers={"Authorization": HOST_TOKEN})
    try:
        async with ModelProxy(runtime, handler, port=port, max_concurrent=2, timeout=5) as proxy:
            agents = []
            for _ in range(2):
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(
                    b"POST /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 2\r\n\r\n{}"
                    % port
                )
                await writer.drain()
                agents.append(writer)
            await asyncio.sleep(10)  # past the proxy's 5 s timeout: both are cut off
            for writer in agents:
                writer.transport.abort()
            for _ in range(100):
                if not proxy._tasks and open_streams == 0:
                    break
                await asyncio.sleep(0.1)
            assert (len(proxy._tasks), open_streams) == (0, 0)
            fast = await raw_http(
                port, b"POST /fast HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", timeout=4
            )
            assert fast.startswith(b"HTTP/1.1 200"), fast[:200]
    finally:
        server.close()


async def test_refusals_cannot_fill_the_hosts_log(
    runtime: Runtime, runtime_dir: RuntimeDir, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md rule 3: every refusal was one warning, and inspect keeps each in
    the sample's transcript (about 3 GiB per sample-hour at the agent's pace). The first
    few are logged in full, then at most one count a minute."""
    port = free_port()

    async def never(request: ProxyRequest) -> ProxyResponse:
        raise AssertionError("a refused request reached the handler")

    caplog.set_level(logging.WARNING, logger="sandbox_tools.injector.model_proxy")
    async with ModelProxy(runtime, never, port=port, timeout=30):
        for _ in range(60):
            answer = await raw_http(port, b"GET /../../x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400")
    refusals = [r for r in caplog.records if "model proxy" in r.getMessage()]
    assert len(refusals) == REFUSALS_LOGGED, [r.getMessage() for r in refusals]
    # Closing the proxy is no event to warn of: only the refusals were logged.
    assert not [r for r in refusals if "ended" in r.getMessage()]


async def test_a_web_page_cannot_spend_the_hosts_credentials(
    runtime: Runtime, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rule 4: a page the agent's browser opens (any page on the web, in
    an outside attack a form it submitted by itself) posted to the in-sandbox proxy and
    the host answered with its credentials. A browser marks what a page sends (Origin,
    Sec-Fetch-*) and names the page's host; SDKs do neither. Such requests get 403 and
    never reach the handler; a DNS-rebound Host is refused the same way."""
    reached: list[str] = []

    async def handler(request: ProxyRequest) -> ProxyResponse:
        reached.append(request.header("host") or "")
        return ProxyResponse.json({"ok": True})

    port = free_port()
    page = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Origin: http://203.0.113.1\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"
    )
    fetch_mode = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\nContent-Length: 2\r\n\r\n{}"
    )
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Length: 2\r\n\r\n{}"
    rebound = post.replace(b"%s", b"evil.example")
    sdk = post.replace(b"%s", b"localhost")
    async with ModelProxy(runtime, handler, port=port, timeout=30):
        for request in (page, fetch_mode, rebound):
            answer = await raw_http(port, request % port)
            assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
        assert (await raw_http(port, sdk % port)).startswith(b"HTTP/1.1 200")
    assert reached == [f"localhost:{port}"]
