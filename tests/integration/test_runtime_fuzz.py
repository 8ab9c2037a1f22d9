"""Fuzzing the JSON-RPC layer and every method's params, with a fixed budget for CI.

THREAT_MODEL.md, rule 5 ("no single request can starve the others") and rule 3 for
the host: random JSON values, types, sizes and unicode, through the `stdio` bridge and
the `exec` CLI into a real server. It runs in a container (the runtime from source,
mounted read-only), so random commands and paths never touch this machine. Asserted:
exactly one well-formed response for every request with an id, no traceback in any
error's data, and the server still answers `version` afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_tools.injector.source_runtime import mounted_source_runtime

pytestmark = [pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(900)]

METHODS = [
    "version",
    "remote_version",
    "runtime_info",
    "bash_session_new_session",
    "bash_session",
    "text_editor",
    "exec_remote_start",
    "exec_remote_poll",
    "exec_remote_kill",
    "exec_remote_write_stdin",
    "exec_remote_close_stdin",
    "mcp_launch_server",
    "mcp_send_request",
    "mcp_send_notification",
    "mcp_send_response",
    "mcp_kill_server",
    "mcp_server_stderr",
    "host_messages_poll",
    "http_tunnel_open",
    "http_tunnel_read",
    "http_tunnel_respond",
    "http_tunnel_body",
    "http_tunnel_cancel",
    "__inspect_json_rpc_response_chunk__",
    "no_such_method",
    "",
]
KEYS = [
    "command", "input", "stdin_open", "env", "cwd", "user", "pid", "ack_seq", "wait_ms",
    "data", "session_name", "wait_for_output", "idle_timeout", "max_output_bytes", "restart",
    "path", "view_range", "file_text", "old_str", "new_str", "insert_line", "_run_as",
    "server_params", "session_id", "request", "notification", "response", "host_messages",
    "request_id", "chunks", "end", "status", "headers", "handle", "offset", "release",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    # A real session name would let random input wait in a real shell for its full
    # wait_for_output: valid, but slow. Everything else about bash_session is fuzzed.
    .filter(lambda text: not text.startswith("BashSession"))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
params = st.one_of(values, st.dictionaries(st.sampled_from(KEYS), values, max_size=6))
requests = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0"]), "method": st.sampled_from(METHODS)},
    optional={"params": params, "id": st.integers(0, 2**40) | st.text(max_size=10) | values},
)
raw_lines = st.one_of(
    requests.map(json.dumps),  # json.dumps writes NaN and Infinity as bare words
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ").decode("latin-1")),
    st.integers(1, 3000).map(lambda depth: "[" * depth * 40),
)


def _not_json(name: str) -> Any:
    raise ValueError(name)


def check_response(line: bytes) -> dict[str, Any]:
    response = json.loads(line)
    assert isinstance(response, dict) and response.get("jsonrpc") == "2.0", line[:200]
    assert ("result" in response) != ("error" in response), line[:200]
    if "error" in response:
        error = response["error"]
        assert isinstance(error["code"], int) and isinstance(error["message"], str)
        assert "Traceback" not in json.dumps(error.get("data")), error
    return response


async def test_fuzzed_requests_through_stdio_and_exec(
    docker_engine: Any, python_container: Any
) -> None:
    sandbox = python_container.sandbox
    launch = mounted_source_runtime()
    env = {**launch.env, "SANDBOX_TOOLS_DIR": "/tmp/fuzz"}
    stream = await sandbox.open_stream([*launch.command, "stdio"], env=env)
    expected: dict[Any, int] = {}
    answered: dict[Any, int] = {}

    async def read_until(sentinel: str, deadline: float) -> None:
        while True:
            line = await asyncio.wait_for(stream.readline(), max(0.1, deadline - time.time()))
            assert line, "the stdio channel closed"
            response = check_response(line)
            key = json.dumps(response.get("id"))
            answered[key] = answered.get(key, 0) + 1
            if response.get("id") == sentinel:
                return

    examples: list[str] = []

    @settings(
        max_examples=250,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(raw_lines)
    def collect(line: str) -> None:
        examples.append(line)

    collect()
    for index, line in enumerate(examples):
        try:  # strict JSON: NaN and Infinity are parse errors, answered with id null
            document = json.loads(line, parse_constant=_not_json)
        except (ValueError, RecursionError):
            document = None
        request_id = document.get("id") if isinstance(document, dict) else None
        if isinstance(request_id, (int, str)) and not isinstance(request_id, bool):
            key = json.dumps(request_id)
            expected[key] = expected.get(key, 0) + 1
        await stream.write(line.encode() + b"\n")
        sentinel = f"sentinel-{index}"
        await stream.write(
            json.dumps({"jsonrpc": "2.0", "id": sentinel, "method": "version"}).encode() + b"\n"
        )
        await read_until(sentinel, time.time() + 60)
    # Slow methods (a poll's long wait) may answer after their sentinel: wait for them.
    deadline = time.time() + 60
    last = "sentinel-final"
    await stream.write(json.dumps({"jsonrpc": "2.0", "id": last, "method": "version"}).encode())
    await stream.write(b"\n")
    await read_until(last, deadline)
    for key, count in expected.items():
        # Each request with a valid id got at least one response with that id (ids may
        # repeat across random examples; every one of them was answered).
        assert answered.get(key, 0) >= count, (key, count, answered.get(key))
    await stream.close()

    # The stateless CLI: every fuzzed line gets one response line and exit 0, except a
    # notification (a request without an id), which JSON-RPC answers with nothing.
    for line in examples[:25]:
        out = await sandbox.exec([*launch.command, "exec"], input=line, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert b"Traceback" not in out.stderr, out.stderr
        lines = out.stdout.splitlines()
        if not lines:
            document = json.loads(line)
            assert isinstance(document, dict) and "id" not in document, line
            continue
        (response_line,) = lines
        check_response(response_line)
    version = await sandbox.exec(
        [*launch.command, "exec", '{"jsonrpc":"2.0","id":1,"method":"version"}'], env=env
    )
    assert check_response(version.stdout)["result"]
