"""Attacks on the surfaces a sandbox uses to reach the host: the model proxy's tunnel,
the sandbox -> host message queue and the MCP bridge, over real processes (the runtime
from source, its `model_proxy`, hostile MCP servers, HTTP listeners on loopback).

The attacker is a client of the runtime's socket (an agent with the runtime's uid, the
normal case when a sandbox's default user is root) or the agent's HTTP client of the
in-sandbox proxy. Each test names the THREAT_MODEL.md rule it defends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.errors import RuntimeRpcError, RuntimeTransportError, ToolError
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    RuntimeClient,
    StdioRuntimeClient,
)
from sandbox_tools.injector.model_proxy import ModelProxy, ProxyResponse, forward_to
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.sandboxes.local import LocalSandbox
from tests.proxy.upstream import RecordingListener
from tests.support import RuntimeDir, free_port, peak_rss_mib, reset_peak_rss

pytest.importorskip("httpx", reason="the [proxy] extra is not installed")
mcp = pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.types import (  # noqa: E402
    INVALID_REQUEST,
    CreateMessageResult,
    LoggingMessageNotificationParams,
    TextContent,
)

from sandbox_tools.injector.mcp_client import (  # noqa: E402
    MAX_DROPPED_MESSAGES,
    sandbox_mcp_client,
)
from sandbox_tools.protocol import MAX_SERVER_MESSAGE_VALUES  # noqa: E402

pytestmark = [pytest.mark.long, pytest.mark.security, pytest.mark.timeout(300)]

HOSTILE = str(Path(__file__).parents[1] / "mcp_servers" / "hostile_server.py")
HOST_TOKEN = "Bearer host-only-token"


@dataclass
class SourceRuntime:
    """The runtime from this checkout, as `ModelProxy` needs it (what ToolSupport gives)."""

    client: RuntimeClient
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture(params=["stdio", "exec"])
async def runtime(
    request: pytest.FixtureRequest, runtime_dir: RuntimeDir
) -> AsyncIterator[SourceRuntime]:
    launch = local_source_runtime(runtime_dir.path)
    kind = StdioRuntimeClient if request.param == "stdio" else ExecRuntimeClient
    client = kind(LocalSandbox(), launch.command, env=launch.env)
    yield SourceRuntime(client, launch.command, launch.env)
    await client.aclose()


async def raw_http(port: int, request: bytes) -> bytes:
    """One request to the in-sandbox proxy, as the agent's own client sends it: `Host: x`
    stands for the proxy's own address, which every SDK sends (the host refuses others)."""
    request = request.replace(b"Host: x\r\n", b"Host: 127.0.0.1:%d\r\n" % port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    # Generous: over exec, 30 MB bodies travel a poll at a time, and a cold run's builds
    # share the machine (the bound under test is bytes and count, not speed).
    answer = await asyncio.wait_for(reader.read(65536), 180)
    writer.close()
    return answer


async def test_the_sandbox_cannot_send_the_hosts_credentials_anywhere_else(
    runtime: SourceRuntime, runtime_dir: RuntimeDir, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces", the tunnel: the host's credentials go
    only to the host's base URL. The path comes from the sandbox, through the proxy or
    straight to `http_tunnel_open` from a client with the runtime's uid; userinfo, host,
    port and dot-segment tricks are refused with 400 and logged, and neither the agent's
    listener nor the upstream's other paths ever see the token."""
    port = free_port()
    async with RecordingListener() as upstream, RecordingListener() as evil:
        handler = forward_to(f"{upstream.url}/openai/v1", headers={"Authorization": HOST_TOKEN})
        async with ModelProxy(runtime, handler, port=port, timeout=30):
            # Straight to the tunnel, as a same-uid client of the runtime socket can.
            attacker = StdioRuntimeClient(LocalSandbox(), runtime.command, env=runtime.env)
            try:
                for path in (
                    f"@127.0.0.1:{evil.port}/x",
                    f":{evil.port}/x",
                    f"0:{evil.port}/x",
                    ".evil.example/x",
                    "/../../admin/keys",
                    "/%2e%2e/%2E%2E/admin/keys",
                    "/a/..%2f..%2fadmin",
                    "//127.0.0.1/x",
                ):
                    head = await attacker.call(
                        "http_tunnel_open",
                        {
                            "method": "GET",
                            "path": path,
                            "headers": [["Host", f"127.0.0.1:{port}"]],
                            "body": "",
                        },
                        timeout=60,
                    )
                    body = await attacker.call(
                        "http_tunnel_read", {"request_id": head["request_id"], "wait_ms": 30_000}
                    )
                    text = b"".join(base64.b64decode(c) for c in body["chunks"]).decode()
                    if path == "//127.0.0.1/x":  # merged slashes: stays under the base
                        assert head["status"] == 200, (path, head)
                    else:
                        assert head["status"] == 400 and "refused" in text, (path, head, text)
            finally:
                await attacker.aclose()
            # Through the proxy, as the agent's HTTP client (uid 1000 or any) can.
            answer = await raw_http(port, b"GET /../../admin/keys HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
            # Headers some gateways read to reroute a request are dropped on the way.
            rerouted = (
                b"GET /models HTTP/1.1\r\nHost: x\r\nX-Original-URL: /admin/keys\r\n"
                b"X-HTTP-Method-Override: DELETE\r\nX-Forwarded-Host: evil.example\r\n\r\n"
            )
            assert (await raw_http(port, rerouted)).startswith(b"HTTP/1.1 200")
    assert evil.requests == []
    assert [r["line"] for r in upstream.requests] == [
        "GET /openai/v1/127.0.0.1/x HTTP/1.1",
        "GET /openai/v1/models HTTP/1.1",
    ]
    assert upstream.requests[0]["headers"]["authorization"] == HOST_TOKEN
    forwarded = upstream.requests[1]["headers"]
    assert not {"x-original-url", "x-http-method-override", "x-forwarded-host"} & set(forwarded)
    assert "refused" in caplog.text


async def test_another_client_can_neither_take_the_messages_nor_answer_for_the_host(
    runtime: SourceRuntime,
) -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces", one owner: while the host listens, a
    second client (an agent with the runtime's uid) cannot subscribe, poll or answer a
    tunnelled request in the host's place."""
    port = free_port()
    async with (
        RecordingListener() as upstream,
        ModelProxy(runtime, forward_to(upstream.url), port=port, timeout=30),
    ):
        attacker = StdioRuntimeClient(LocalSandbox(), runtime.command, env=runtime.env)
        try:
            with pytest.raises(ToolError, match="another client receives"):
                await attacker.call("host_messages_subscribe", {"key": "x" * 32})
            with pytest.raises(ToolError, match="another client receives"):
                await attacker.call("host_messages_poll", {"key": "x" * 32})
            with pytest.raises(ToolError, match="only the client"):
                await attacker.call(
                    "http_tunnel_respond",
                    {"request_id": "h0", "status": 200, "headers": [], "key": "x" * 32},
                )
        finally:
            await attacker.aclose()
        answer = await raw_http(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")  # the host still answers


async def test_a_late_answer_to_an_abandoned_call_leaves_the_channel_whole(
    runtime_dir: RuntimeDir,
) -> None:
    """THREAT_MODEL.md rule 5 (no request wedges the rest): an answer that arrives after
    its call timed out is dropped; calls in flight and listeners go on; closing one
    ModelProxy and opening another on the same client works."""
    launch = local_source_runtime(runtime_dir.path)
    client = StdioRuntimeClient(LocalSandbox(), launch.command, env=launch.env)
    runtime = SourceRuntime(client, launch.command, launch.env)
    try:
        port = free_port()
        async with RecordingListener() as upstream:
            async with ModelProxy(runtime, forward_to(upstream.url), port=port, timeout=30):
                slow = asyncio.create_task(
                    client.call("host_messages_poll", {"key": client.host_key, "wait_ms": 3000}, 10)
                )
                with pytest.raises(Exception, match=r"within 0\.5 s"):
                    await client.call(
                        "host_messages_poll", {"key": client.host_key, "wait_ms": 1500}, 0.5
                    )
                await asyncio.sleep(2)  # its answer arrives now, to nobody
                assert (await client.call("version")) and not slow.done()
                await slow
                answer = await raw_http(port, b"GET /v1/a HTTP/1.1\r\nHost: x\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 200")
            async with ModelProxy(runtime, forward_to(upstream.url), port=port, timeout=30):
                answer = await raw_http(port, b"GET /v1/b HTTP/1.1\r\nHost: x\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 200")
    finally:
        await client.aclose()


async def test_a_restarted_server_is_noticed_and_the_proxy_answers_again(
    runtime: SourceRuntime, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rule 5 (a dead server recovers) and rule 3: after the runtime
    server is killed, the host subscribes again (or polls the new server from its first
    message) and the model proxy answers; an MCP session of the old server fails loudly
    instead of hearing the new server's sessions."""
    port = free_port()
    server = StdioServerParameters(command=sys.executable, args=[HOSTILE, "quiet"])
    orphans: list[int] = []
    try:
        await _restart_under_the_proxy(runtime, runtime_dir, port, server, orphans)
    finally:
        # The killed server's proxy process outlives it (its parent is gone, and the new
        # server does not know it): on this host it would stay after the test.
        for orphan in orphans:
            with contextlib.suppress(OSError):
                if b"model_proxy" in Path(f"/proc/{orphan}/cmdline").read_bytes():
                    os.kill(orphan, signal.SIGKILL)


async def _restart_under_the_proxy(
    runtime: SourceRuntime,
    runtime_dir: RuntimeDir,
    port: int,
    server: StdioServerParameters,
    orphans: list[int],
) -> None:
    async with (
        RecordingListener() as upstream,
        ModelProxy(runtime, forward_to(upstream.url), port=port, timeout=5) as proxy,
        sandbox_mcp_client(runtime.client, server) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        if proxy._process is not None:
            orphans.append(proxy._process.pid)
        pid = runtime_dir.server_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        # The next call starts a new server (exec), or the bridge reports the loss
        # and the client subscribes again (stdio). A call in flight at the kill
        # fails (it is never silently sent twice).
        with contextlib.suppress(RuntimeRpcError):
            await runtime.client.call("version")
        deadline = asyncio.get_running_loop().time() + 60
        while asyncio.get_running_loop().time() < deadline:
            answer = await raw_http(port, b"GET /v1/c HTTP/1.1\r\nHost: x\r\n\r\n")
            if answer.startswith(b"HTTP/1.1 200"):
                break
            await asyncio.sleep(0.2)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert runtime_dir.server_pid() not in (None, pid)
        with pytest.raises(Exception, match=r"no MCP session|restarted|stopped"):
            await session.call_tool("echo", {"text": "hi"})


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    "attack",
    [["flood", "15000000", "1000"], ["sampling", "20000000", "60"]],
    ids=["notifications", "sampling"],
)
async def test_an_mcp_flood_behind_a_slow_callback_keeps_host_memory_bounded(
    runtime: SourceRuntime, attack: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md rule 3 (the host is never exhausted): a server that sends one
    sampling request and then 1000 x 15 MB notifications, or 60 x 20 MB sampling
    requests, while the host's sampling callback is slow, costs the host a bounded
    amount of memory; the session is ended and the host says why."""
    release = asyncio.Event()

    async def slow_sampling(context: Any, params: Any) -> CreateMessageResult:
        await release.wait()
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="late"), model="m"
        )

    caplog.set_level(logging.WARNING)
    server = StdioServerParameters(command=sys.executable, args=[HOSTILE, *attack])
    baseline = rss_mib()
    peak = baseline
    async with (
        sandbox_mcp_client(runtime.client, server) as (read, write),
        ClientSession(read, write, sampling_callback=slow_sampling) as session,
    ):
        await session.initialize()
        for _ in range(600):  # up to 60 s
            peak = max(peak, rss_mib())
            if "fell behind" in caplog.text:
                break
            await asyncio.sleep(0.1)
        for _ in range(30):  # and a little longer: nothing keeps growing
            peak = max(peak, rss_mib())
            await asyncio.sleep(0.1)
        release.set()
    growth = peak - baseline
    print(f"host RSS under {attack[0]}: baseline {baseline:.0f} MiB, peak {peak:.0f} MiB")
    assert "fell behind" in caplog.text
    assert growth < 600, f"the host grew by {growth:.0f} MiB"


async def test_an_oversized_or_chatty_server_blocks_no_other_session(
    runtime: SourceRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces": a notification that grows past the
    message limit when encoded (30 MB of 'é') is refused in the sandbox and reported,
    never left at the head of the queue; an endless stream of small notifications from
    one server does not starve another session or the model proxy."""
    caplog.set_level(logging.WARNING)
    big = StdioServerParameters(command=sys.executable, args=[HOSTILE, "unicode", "15000000"])
    chatty = StdioServerParameters(command=sys.executable, args=[HOSTILE, "chatter"])
    quiet = StdioServerParameters(command=sys.executable, args=[HOSTILE, "quiet"])
    port = free_port()
    async with (
        RecordingListener() as upstream,
        ModelProxy(runtime, forward_to(upstream.url), port=port, timeout=30),
        sandbox_mcp_client(runtime.client, big) as (read1, write1),
        ClientSession(read1, write1) as first,
        sandbox_mcp_client(runtime.client, chatty) as (read2, write2),
        ClientSession(read2, write2) as second,
        sandbox_mcp_client(runtime.client, quiet) as (read3, write3),
        ClientSession(read3, write3) as third,
    ):
        for session in (first, second, third):
            await session.initialize()
        for _ in range(300):
            if "was dropped" in caplog.text:
                break
            await asyncio.sleep(0.1)
        assert "larger than" in caplog.text
        for n in range(5):
            result = await asyncio.wait_for(third.call_tool("echo", {"text": f"n{n}"}), 10)
            assert isinstance(result.content[0], TextContent)
            assert result.content[0].text == f"n{n}"
            answer = await asyncio.wait_for(
                raw_http(port, b"GET /v1/d HTTP/1.1\r\nHost: x\r\n\r\n"), 10
            )
            assert answer.startswith(b"HTTP/1.1 200")
        assert (await first.call_tool("echo", {"text": "still"})).content


async def _loop_stalls(worst: list[float]) -> None:
    """Keeps in worst[0] the longest the event loop was held (ticks of 10 ms)."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(0.01)
        worst[0] = max(worst[0], loop.time() - started - 0.01)


async def test_mcp_requests_over_the_message_value_cap_never_reach_the_sdk(
    runtime: SourceRuntime,
) -> None:
    """THREAT_MODEL.md rule 3 (everything read from a sandbox is bounded in bytes and
    time): two servers each send three sampling requests of 199,000 tiny messages (995,000
    values, just under the transport's million). Validated into the SDK's models each held
    ~400 MiB and 7.7 s of the event loop (two sessions: 1061 MiB, an 11.4 s stall). Over
    MAX_SERVER_MESSAGE_VALUES they are answered with an error before the SDK sees them,
    the host's callback is never called, and a quiet session keeps answering."""
    calls = 0
    answers: list[str] = []

    async def sampling(context: Any, params: Any) -> CreateMessageResult:
        nonlocal calls
        calls += 1
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="ok"), model="m"
        )

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        answers.append(str(params.data))

    wide = StdioServerParameters(command=sys.executable, args=[HOSTILE, "wide", "199000", "3"])
    quiet = StdioServerParameters(command=sys.executable, args=[HOSTILE, "quiet"])
    stalls = [0.0]
    ticker = asyncio.create_task(_loop_stalls(stalls))
    reset_peak_rss()
    baseline = rss_mib()
    worst = 0.0
    try:
        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(sandbox_mcp_client(runtime.client, quiet))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            for _ in range(2):
                read, write = await stack.enter_async_context(
                    sandbox_mcp_client(runtime.client, wide)
                )
                flooder = await stack.enter_async_context(
                    ClientSession(read, write, sampling_callback=sampling, logging_callback=on_log)
                )
                await flooder.initialize()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            while len(answers) < 6 and loop.time() < deadline:
                started = loop.time()
                await asyncio.wait_for(session.list_tools(), 30)
                worst = max(worst, loop.time() - started)
                await asyncio.sleep(0.2)
    finally:
        ticker.cancel()
    growth = peak_rss_mib() - baseline
    print(
        f"2 x 3 sampling requests of 995k values: RSS {baseline:.0f} MiB + {growth:.0f}, "
        f"longest loop stall {stalls[0]:.2f} s, quiet session's worst {worst:.2f} s"
    )
    assert answers == [f"answered {INVALID_REQUEST}"] * 6  # over MAX_SERVER_MESSAGE_VALUES
    assert calls == 0
    assert growth < 600, f"the host grew by {growth:.0f} MiB"
    assert stalls[0] < 4, f"the event loop was held {stalls[0]:.2f} s"


async def test_mcp_notifications_the_sdk_cannot_validate_are_counted_not_logged_each(
    runtime: SourceRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md rule 3 (nothing a sandbox sends grows the host without bound,
    its log included): a server sends notifications of a method MCP does not have, paced
    under the listener's bound. The SDK logged one WARNING with pydantic's error text for
    each (about 400 a second, 6 GB an hour, and inspect keeps every record in the
    transcript). They are dropped before the SDK sees them, told once and then in a
    summary, and past MAX_DROPPED_MESSAGES the session is ended and its server killed."""
    caplog.set_level(logging.INFO)
    server = StdioServerParameters(command=sys.executable, args=[HOSTILE, "invalid", "0.002"])
    ended: Exception | None = None
    async with (
        sandbox_mcp_client(runtime.client, server) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for _ in range(60):
            await asyncio.sleep(1)
            try:
                await asyncio.wait_for(session.send_ping(), 10)
            except Exception as exc:
                ended = exc
                break
        # a later call fails saying why (within 30 s: it waited out its timeout, 600 s)
        with pytest.raises(Exception, match="session was ended"):
            await asyncio.wait_for(session.list_tools(), 30)
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    print(f"{MAX_DROPPED_MESSAGES}+ invalid notifications: {len(records)} warnings; {ended!r:.200}")
    assert ended is not None, "the session was not ended"
    assert f"more than {MAX_DROPPED_MESSAGES} messages the host refused" in caplog.text
    assert not [r for r in records if r.name == "root"], "the SDK logged them one by one"
    assert len(records) <= 5, [r.getMessage()[:200] for r in records]


async def test_deeply_nested_mcp_notifications_are_counted_not_a_traceback_each(
    runtime: SourceRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md rule 3: notifications nested 260 deep (valid JSON, within every
    size bound) failed the SDK's serializer, and the host logged an ERROR with a
    traceback for each (3,000 messages: 2.8 MiB of log, copied into the transcript).
    They are dropped as messages the host cannot read, told once, then counted."""
    caplog.set_level(logging.INFO)
    server = StdioServerParameters(command=sys.executable, args=[HOSTILE, "deep", "260", "300"])
    async with (
        sandbox_mcp_client(runtime.client, server) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await asyncio.sleep(3)
        await asyncio.wait_for(session.send_ping(), 10)  # the session still works
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    print(f"300 notifications nested 260 deep: {len(records)} warnings")
    assert not [r for r in records if r.exc_info], "a traceback was logged"
    assert len(records) <= 5, [r.getMessage()[:200] for r in records]
    assert "cannot be read as MCP" in caplog.text


async def test_messages_the_runtime_drops_are_counted_and_end_the_session(
    runtime: SourceRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md rule 3: notifications past the runtime's value bound are dropped
    in the sandbox, which tells the host; the host logged a WARNING for each (3,000: 537 KB
    of log in 9 s) and the session went on for ever. They are counted with the host's own
    drops: told once, then summed, and past MAX_DROPPED_MESSAGES the session ends."""
    caplog.set_level(logging.INFO)
    count = MAX_DROPPED_MESSAGES + 100
    server = StdioServerParameters(
        command=sys.executable,
        args=[HOSTILE, "widenotes", str(MAX_SERVER_MESSAGE_VALUES + 1), str(count)],
    )
    async with (
        sandbox_mcp_client(runtime.client, server) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for _ in range(120):
            await asyncio.sleep(1)
            if f"more than {MAX_DROPPED_MESSAGES} messages that were dropped" in caplog.text:
                break
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    print(f"{count} dropped notifications: {len(records)} warnings")
    assert f"more than {MAX_DROPPED_MESSAGES} messages that were dropped" in caplog.text
    assert len(records) <= 6, [r.getMessage()[:200] for r in records]


def test_hostile_server_is_valid_json_lines() -> None:
    """The attack server itself speaks JSON lines (a broken attacker proves nothing)."""
    import subprocess

    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-03-26"},
    }
    done = subprocess.run(
        [sys.executable, HOSTILE, "quiet"],
        input=json.dumps(init) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(done.stdout)["result"]["serverInfo"]["name"] == "hostile-quiet"


async def test_a_runtime_that_dies_before_answering_says_why(tmp_path: Path) -> None:
    """THREAT_MODEL.md rule 3 (a failure is typed and explained): a runtime that cannot
    start (its disk filled while it unpacked) is reported with what it printed, not only
    as a closed channel."""
    runtime = tmp_path / "runtime"
    runtime.write_text(
        "#!/bin/sh\necho 'sandbox-tools: unpacking: No space left on device' >&2\nexit 71\n"
    )
    runtime.chmod(0o755)
    client = StdioRuntimeClient(LocalSandbox(), [str(runtime)])
    try:
        with pytest.raises(RuntimeTransportError, match="No space left on device"):
            await client.call("version", timeout=30)
    finally:
        await client.aclose()


async def test_an_agent_that_kills_or_squats_the_proxy_is_seen_by_the_host(
    runtime: SourceRuntime,
) -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces", the tunnel: the agent can take the
    proxy's port first or kill the proxy (as can the OOM killer); the host sees either
    at once (a start error naming the port, `ended` and a warning), and neither exposes
    anything of the host's."""
    port = free_port()
    squatter = await asyncio.start_server(lambda r, w: None, "127.0.0.1", port)
    try:
        with pytest.raises(Exception, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
            await ModelProxy(runtime, forward_to("http://127.0.0.1:9"), port=port).start()
    finally:
        squatter.close()
    async with ModelProxy(runtime, forward_to("http://127.0.0.1:9"), port=port) as proxy:
        killer = await asyncio.create_subprocess_exec(
            "pkill", "-KILL", "-f", f"model_proxy --port {port}"
        )
        assert await killer.wait() == 0
        for _ in range(200):
            if proxy.ended is not None:
                break
            await asyncio.sleep(0.1)
        assert proxy.ended == "exit code 137"  # 128 + SIGKILL


@pytest.mark.parametrize("size", [1_400_000, 10_000_000], ids=["under-the-value-cap", "over-it"])
async def test_dense_json_floods_keep_host_memory_and_latency_bounded(
    runtime: SourceRuntime, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """THREAT_MODEL.md rule 3 and "Sandbox -> host surfaces": JSON that costs ~24 times
    its size as objects (`[{},{},...]`) is bounded by what it costs, not by its bytes.
    Messages of more than a million values are dropped before anyone parses them; under
    that, four flooding servers together cost the host a bounded amount of memory, and a
    quiet session and the model proxy still answer promptly."""
    caplog.set_level(logging.WARNING)
    quiet = StdioServerParameters(command=sys.executable, args=[HOSTILE, "quiet"])
    dense = StdioServerParameters(command=sys.executable, args=[HOSTILE, "dense", str(size), "40"])
    port = free_port()
    baseline = peak = rss_mib()
    async with contextlib.AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(RecordingListener())
        await stack.enter_async_context(
            ModelProxy(runtime, forward_to(upstream.url), port=port, timeout=30)
        )
        read, write = await stack.enter_async_context(sandbox_mcp_client(runtime.client, quiet))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        for _ in range(4):
            read, write = await stack.enter_async_context(sandbox_mcp_client(runtime.client, dense))
            flooder = await stack.enter_async_context(ClientSession(read, write))
            await flooder.initialize()
        worst = 0.0
        for n in range(10):
            started = asyncio.get_running_loop().time()
            result = await asyncio.wait_for(session.call_tool("echo", {"text": f"n{n}"}), 60)
            answer = await asyncio.wait_for(
                raw_http(port, b"GET /v1/e HTTP/1.1\r\nHost: x\r\n\r\n"), 60
            )
            worst = max(worst, asyncio.get_running_loop().time() - started)
            assert result.content and answer.startswith(b"HTTP/1.1 200")
            peak = max(peak, rss_mib())
            await asyncio.sleep(0.3)
    print(f"dense {size}: host RSS {baseline:.0f} -> peak {peak:.0f} MiB, worst {worst:.2f} s")
    assert peak - baseline < 700, f"the host grew by {peak - baseline:.0f} MiB"
    assert worst < 15
    if size > 3_000_000:
        assert "JSON values" in caplog.text  # refused in the sandbox, unparsed


async def test_big_bodies_and_many_requests_are_bounded_on_the_host(
    runtime: SourceRuntime, runtime_dir: RuntimeDir
) -> None:
    """THREAT_MODEL.md rule 3, the tunnel: requests the host holds are bounded in bytes
    (past that the sandbox gets 503 at once) and in number; a request with hundreds of
    headers is refused in the runtime before it reaches the host."""
    release = asyncio.Event()

    async def slow(request: Any) -> ProxyResponse:
        await release.wait()
        return ProxyResponse.json({"bytes": len(request.body)})

    port = free_port()
    body = b"x" * (30 * 1024 * 1024)
    head = f"POST /v1/big HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    baseline = rss_mib()
    async with ModelProxy(runtime, slow, port=port, timeout=60) as proxy:
        sending = [asyncio.create_task(raw_http(port, head + body)) for _ in range(12)]
        done, _ = await asyncio.wait(sending, timeout=90, return_when=asyncio.FIRST_COMPLETED)
        assert done  # the refusals come back while the others are held
        peak = rss_mib()
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*sending), 240)
        statuses = sorted(a.split(b" ")[1].decode() for a in answers)
        assert "503" in statuses and "200" in statuses, statuses
        for _ in range(100):  # every held request is let go once answered
            if not proxy._tasks:
                break
            await asyncio.sleep(0.1)
        assert not proxy._tasks and proxy._held == 0
        attacker = StdioRuntimeClient(LocalSandbox(), runtime.command, env=runtime.env)
        try:
            with pytest.raises(RuntimeRpcError, match="headers"):
                await attacker.call(
                    "http_tunnel_open",
                    {"method": "GET", "path": "/", "headers": [["a", ""]] * 300, "body": ""},
                )
        finally:
            await attacker.aclose()
    print(f"12 x 30 MB bodies: host RSS {baseline:.0f} -> {peak:.0f} MiB")
    assert peak - baseline < 800


async def test_killing_the_hosts_channel_is_reported_by_the_proxy(runtime_dir: RuntimeDir) -> None:
    """THREAT_MODEL.md rule 5 (the host notices): an agent with the runtime's uid that
    kills the host's `stdio` bridge stops the model proxy; the host's ModelProxy says so
    (`ended`, an error in the log) instead of looking alive."""
    launch = local_source_runtime(runtime_dir.path)
    client = StdioRuntimeClient(LocalSandbox(), launch.command, env=launch.env)
    runtime = SourceRuntime(client, launch.command, launch.env)
    try:
        async with ModelProxy(runtime, forward_to("http://127.0.0.1:9"), port=free_port()) as proxy:
            stream: Any = client._stream
            os.kill(stream._process.pid, signal.SIGKILL)
            for _ in range(100):
                if proxy.ended:
                    break
                await asyncio.sleep(0.1)
            assert proxy.ended and "stopped receiving" in proxy.ended
    finally:
        await client.aclose()
