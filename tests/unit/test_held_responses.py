"""Held large responses are bounded in number and age (THREAT_MODEL: nothing grows without
limit in the runtime), and a dropped handle is a clear -32000, never a wrong answer."""

from __future__ import annotations

import json

import pytest

from sandbox_tools.protocol import CONTINUATION_UNKNOWN, RESPONSE_CHUNK_FIELD
from sandbox_tools.runtime import chunks
from sandbox_tools.runtime.jsonrpc import RpcError, encode, result_response


def held(store: chunks.HeldResponses, n: int) -> str:
    frame = store.fit(encode(result_response(n, "x" * 5000)), 1000)
    piece = json.loads(frame)[RESPONSE_CHUNK_FIELD]
    assert len(frame) <= 1000 and piece["offset"] == 0 and not piece["done"]
    handle: str = piece["handle"]
    return handle


async def test_the_oldest_held_response_is_dropped_past_the_bound() -> None:
    store = chunks.HeldResponses()
    handles = [held(store, n) for n in range(chunks.MAX_HELD_RESPONSES + 1)]
    with pytest.raises(RpcError) as dropped:
        await store.continuation({"handle": handles[0], "offset": 10})
    assert dropped.value.code == CONTINUATION_UNKNOWN
    newest = await store.continuation({"handle": handles[-1], "offset": 10})
    assert newest[RESPONSE_CHUNK_FIELD]["offset"] == 10


async def test_held_responses_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    store = chunks.HeldResponses()
    handle = held(store, 1)
    monkeypatch.setattr(chunks, "HELD_TTL_S", -1.0)
    with pytest.raises(RpcError, match="unknown or expired"):
        await store.continuation({"handle": handle, "offset": 0})


async def test_an_offset_outside_the_response_is_invalid_params() -> None:
    store = chunks.HeldResponses()
    handle = held(store, 1)
    with pytest.raises(RpcError, match='field "offset"'):
        await store.continuation({"handle": handle, "offset": 10**9})
