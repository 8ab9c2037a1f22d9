"""A response larger than the sandbox lets one exec print comes in pieces (the held
responses of the runtime, asked for by the exec client), never as a transport error.

inspect's sandboxes cap an exec's output (10 MiB, or what the task sets); a bash_session
answer cut at that size, or a large view, is still larger once escaped as JSON."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.jsonrpc_client import ExecRuntimeClient, _chunk_fields
from sandbox_tools.injector.source_runtime import local_source_runtime
from sandbox_tools.sandboxes.base import ExecOutput
from sandbox_tools.sandboxes.local import LocalSandbox


class CappedSandbox(LocalSandbox):
    """This machine, with an exec that refuses output past `limit` bytes (as inspect's)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.largest = 0

    def exec_output_limit(self) -> int:
        return self.limit

    async def exec(self, *args: Any, **kwargs: Any) -> ExecOutput:
        result = await super().exec(*args, **kwargs)
        self.largest = max(self.largest, len(result.stdout))
        assert len(result.stdout) <= self.limit, "the runtime printed past the cap"
        return result


async def test_a_response_past_the_cap_arrives_whole(runtime_dir: Any, tmp_path: Path) -> None:
    text = "".join(f'line {n} with "quotes" and \\ and é\n' for n in range(3000))
    (tmp_path / "big.txt").write_text(text)
    launch = local_source_runtime(runtime_dir.path)
    capped = CappedSandbox(8192)
    client = ExecRuntimeClient(capped, launch.command, env=launch.env)
    whole = ExecRuntimeClient(LocalSandbox(), launch.command, env=launch.env)
    params = {"command": "view", "path": str(tmp_path / "big.txt")}
    try:
        expected = await whole.call("text_editor", params)
        got = await client.call("text_editor", params)
    finally:
        await client.aclose()
        await whole.aclose()
    assert got == expected and len(expected) > 8192
    assert 0 < capped.largest <= 8192


def piece(handle: str, offset: int, data: bytes, total: int) -> dict[str, Any]:
    import base64

    end = offset + len(data)
    return {
        "handle": handle,
        "offset": offset,
        "next_offset": end,
        "total_size": total,
        "done": end == total,
        "chunk": base64.b64encode(data).decode(),
    }


def test_a_good_piece_is_read() -> None:
    assert _chunk_fields(piece("h", 4, b"abcd", 8), "h", 4) == ("h", b"abcd", True)


@pytest.mark.parametrize(
    ("bad", "handle", "offset"),
    [
        (piece("other", 0, b"ab", 4), "h", 0),  # another handle
        (piece("h", 2, b"ab", 6), "h", 0),  # not where the last one ended
        ({**piece("h", 0, b"ab", 4), "next_offset": 3}, "h", 0),  # says it ends elsewhere
        ({**piece("h", 0, b"ab", 4), "done": True}, "h", 0),  # done before the end
        (piece("h", 0, b"", 4), "h", 0),  # no progress: would loop forever
        (piece("h", 0, b"ab", 1 << 40), "h", 0),  # a total past what the host accepts
        ({**piece("h", 0, b"ab", 4), "chunk": "%%%"}, "h", 0),  # not base64
        ({**piece("h", 0, b"ab", 4), "offset": True}, "h", 0),  # a bool is no offset
        ("not an object", None, 0),
    ],
)
def test_a_piece_that_does_not_continue_the_response_is_refused(
    bad: Any, handle: str | None, offset: int
) -> None:
    with pytest.raises(RuntimeTransportError):
        _chunk_fields(bad, handle, offset)


class PieceByPieceRuntime(LocalSandbox):
    """A runtime the agent controls, answering every call with pieces of `size` bytes of
    a 64 MiB response (it ran for days, a call's timeout applying to each piece alone)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.calls = 0

    def exec_output_limit(self) -> int:
        return 4096

    async def exec(self, *args: Any, **kwargs: Any) -> ExecOutput:
        import json

        self.calls += 1
        await asyncio.sleep(0.05)  # an exec's cost: the pieces come at a pace
        request = json.loads(kwargs["input"])
        offset = request["params"].get("offset", 0) if self.calls > 1 else 0
        body = {"jsonrpc": "2.0", "id": request["id"]}
        body["__inspect_json_rpc_response_chunk__"] = piece("h", offset, b"x" * self.size, 1 << 26)
        return ExecOutput(0, json.dumps(body).encode() + b"\n", b"")


@pytest.mark.parametrize("size", [1, 2048])
async def test_a_response_handed_out_slowly_is_refused_within_the_calls_time(size: int) -> None:
    runtime = PieceByPieceRuntime(size)
    client = ExecRuntimeClient(runtime, ["unused"])
    pattern = "at least 1024" if size < 1024 else "did not arrive whole within 2 s"
    with pytest.raises(RuntimeTransportError, match=pattern):
        await asyncio.wait_for(client.call("version", timeout=2), 60)
