"""The host is never misled, exhausted or hung by what a sandbox sends back.

THREAT_MODEL.md, rule 3: "Every read from a sandbox is bounded in bytes and time, by
default; cleanup and kill paths are bounded too; a malformed response is a typed
RuntimeTransportError, never an AttributeError." Each test names the bound it shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_tools.errors import RuntimeTransportError, SandboxOutputLimitError, SandboxToolsError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.jsonrpc_client import (
    ExecRuntimeClient,
    StdioRuntimeClient,
    unwrap_response,
)
from sandbox_tools.sandboxes.base import (
    DEFAULT_EXEC_TIMEOUT,
    MAX_STREAM_LINE,
    ExecOutput,
    LineSplitter,
    Sandbox,
    Stream,
    StreamLineTooLong,
)
from sandbox_tools.sandboxes.local import LocalSandbox
from tests.support import SRC, RuntimeDir, peak_rss_mib, reset_peak_rss, rss_mib


class HostileSandbox(Sandbox):
    """A provider whose every exec prints the bytes the test chose (a hostile image)."""

    def __init__(self, stdout: bytes, returncode: int = 0) -> None:
        self.name = "hostile"
        self.stdout = stdout
        self.returncode = returncode

    async def exec(
        self,
        cmd: list[str],
        input: bytes | memoryview | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        max_output: int = 1 << 26,
    ) -> ExecOutput:
        return ExecOutput(self.returncode, self.stdout, b"")

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        raise NotImplementedError

    async def read_file(self, path: str) -> bytes:
        raise NotImplementedError


HOSTILE_RESPONSES = [
    b"not json at all",
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in json, once
    b'{"jsonrpc": "2.0", "id": 1}',
    b'{"jsonrpc": "2.0", "id": 1, "error": "boom"}',
    b'{"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": 3}}',
    b'{"jsonrpc": "2.0", "id": 1, "error": null}',
    b'{"jsonrpc": "1.0", "id": 1, "result": 1}',
    b"[]",
    b"\xff\xfe\x00garbage",
]


@pytest.mark.parametrize("response", HOSTILE_RESPONSES, ids=range(len(HOSTILE_RESPONSES)))
async def test_malformed_responses_are_transport_errors(response: bytes) -> None:
    """Rule 3: a malformed response is a typed RuntimeTransportError."""
    client = ExecRuntimeClient(HostileSandbox(response), ["/x"])
    with pytest.raises(RuntimeTransportError):
        await client.call("version")


@pytest.mark.parametrize(
    "result",
    [None, [], {"pid": "1"}, {"pid": True}, {"pid": 1.5}, "x"],
)
async def test_malformed_results_are_transport_errors(result: Any) -> None:
    """exec_remote_start answered with something that is not {pid: int}."""
    response = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()
    client = ExecRuntimeClient(HostileSandbox(response), ["/x"])
    with pytest.raises(RuntimeTransportError):
        await exec_remote(client, "true")


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=20,
    )
)
def test_any_json_value_unwraps_or_raises_a_typed_error(value: Any) -> None:
    for document in (value, {"jsonrpc": "2.0", "id": 1, "error": value}):
        try:
            unwrap_response(document, "fuzz")
        except SandboxToolsError:
            pass


async def test_local_exec_flood_is_cut_at_the_byte_cap() -> None:
    """Rule 3: an exec that prints forever ends at its cap, and the host stays small."""
    before = peak_rss_mib()
    started = time.monotonic()
    with pytest.raises(SandboxOutputLimitError):
        await LocalSandbox().exec(["sh", "-c", "yes flood"], max_output=8 << 20, timeout=60)
    assert time.monotonic() - started < 30
    assert peak_rss_mib() - before < 64  # 8 MiB kept at most, plus working buffers


SHORT_LINES = "import sys\nsys.stdout.buffer.write(b'ab\\n' * (64 * 1024 * 1024 // 3 - 20))\n"
ANSWER = 'print(\'{"jsonrpc": "2.0", "id": 1, "result": "kept"}\')\n'


@pytest.mark.security
@pytest.mark.parametrize("last", ["", ANSWER], ids=["garbage", "then-an-answer"])
async def test_an_exec_answer_of_many_short_lines_is_not_split(tmp_path: Path, last: str) -> None:
    """THREAT_MODEL.md rule 3 (everything read from a sandbox is bounded in bytes and
    time): a replaced runtime (an agent with the runtime's uid, a hostile image) answers
    an exec with 64 MiB of `ab\\n`. Only the last line is taken: split, the output was
    22 million bytes objects (the host grew by 1.3 GB for one call). A real answer after
    the lines is still the call's result."""
    runtime = tmp_path / "runtime.py"
    runtime.write_text(SHORT_LINES + last)
    client = ExecRuntimeClient(LocalSandbox(), [sys.executable, str(runtime)])
    reset_peak_rss()
    before = rss_mib()
    if last:
        assert await client.call("version", timeout=60) == "kept"
    else:
        with pytest.raises(RuntimeTransportError, match="not JSON"):
            await client.call("version", timeout=60)
    growth = peak_rss_mib() - before
    print(f"64 MiB of short lines: host RSS {before:.0f} MiB, grew by {growth:.0f} MiB")
    assert growth < 400, f"the host grew by {growth:.0f} MiB"


def test_line_splitter_caps_lines_and_scans_each_byte_once() -> None:
    splitter = LineSplitter(max_line=1000)
    splitter.feed(b"a" * 500)
    assert splitter.next_line() is None
    splitter.feed(b"b" * 400 + b"\nrest")
    assert splitter.next_line() == b"a" * 500 + b"b" * 400 + b"\n"
    assert splitter.next_line() is None
    splitter.feed(b"c" * 1000)
    with pytest.raises(StreamLineTooLong):
        splitter.next_line()


def test_a_callers_lower_limit_bounds_a_line_whole_or_still_coming() -> None:
    """The probe's reader asks for lines within its own bound: past it, a line still
    without its newline and a whole line that arrived in one chunk are both refused;
    within it, a line is given as always."""
    splitter = LineSplitter(max_line=1000)
    splitter.feed(b"x" * 99 + b"\n")
    assert splitter.next_line(limit=100) == b"x" * 99 + b"\n"
    splitter.feed(b"y" * 200 + b"\n")
    with pytest.raises(StreamLineTooLong):
        splitter.next_line(limit=100)
    still_coming = LineSplitter(max_line=1000)
    still_coming.feed(b"z" * 101)
    with pytest.raises(StreamLineTooLong):
        still_coming.next_line(limit=100)


class ScriptedStream(Stream):
    """A persistent channel that sends the lines the test chose, then stays silent."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = list(lines)
        self.closed = asyncio.Event()

    async def write(self, data: bytes) -> None:
        pass

    async def readline(self, limit: int = MAX_STREAM_LINE) -> bytes:
        if self.lines:
            return self.lines.pop(0)
        await self.closed.wait()
        return b""

    async def close(self) -> None:
        self.closed.set()


class StreamSandbox(HostileSandbox):
    def __init__(self, lines: list[bytes]) -> None:
        super().__init__(b"")
        self.lines = lines

    async def open_stream(
        self, cmd: list[str], env: Mapping[str, str] | None = None, user: str | None = None
    ) -> Stream:
        return ScriptedStream(self.lines)


@pytest.mark.parametrize(
    "lines",
    [
        [b"garbage that is not JSON\n"],
        [b'{"jsonrpc": "2.0", "id": 999, "result": 1}\n'],  # answers nothing we asked
        [b'{"jsonrpc": "2.0", "id": "1", "result": 1}\n'],
        [b"[" * 50_000 + b"\n"],
    ],
)
async def test_a_channel_sending_garbage_is_declared_failed(lines: list[bytes]) -> None:
    """Rule 3: a channel that emits garbage fails the calls in flight at once."""
    client = StdioRuntimeClient(StreamSandbox(lines), ["/x"])
    started = time.monotonic()
    with pytest.raises(RuntimeTransportError, match="channel failed"):
        await client.call("version", timeout=30)
    assert time.monotonic() - started < 5
    await client.aclose()


async def test_a_silent_channel_times_out_with_a_typed_error() -> None:
    """Rule 3: every call has a finite timeout; silence is a RuntimeTransportError."""
    client = StdioRuntimeClient(StreamSandbox([]), ["/x"])
    started = time.monotonic()
    with pytest.raises(RuntimeTransportError, match=r"within 0\.5 s"):
        await client.call("version", timeout=0.5)
    assert time.monotonic() - started < 3
    await client.aclose()


async def test_exec_remote_returns_within_its_timeout_when_the_runtime_is_stopped(
    runtime_dir: RuntimeDir,
) -> None:
    """Rule 3: SIGSTOP of the server during exec_remote(timeout=...) used to hang even
    the caller's asyncio.wait_for (a shielded kill awaited without a bound)."""
    sandbox = LocalSandbox({**runtime_dir.env, "PYTHONPATH": SRC})
    for transport in (ExecRuntimeClient, StdioRuntimeClient):
        client = transport(sandbox, [sys.executable, "-m", "sandbox_tools.runtime"])
        process = await exec_remote(client, "sleep 60", ExecRemoteOptions(timeout=3))
        pid = runtime_dir.server_pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(process.wait(), 30)
            elapsed = time.monotonic() - started
            # The deadline (3 s), one poll's grace (1 s) and the bounded kill (5 s).
            assert elapsed < 3 + 1 + 5 + 2, elapsed
        finally:
            os.kill(pid, signal.SIGCONT)
            await client.aclose()
