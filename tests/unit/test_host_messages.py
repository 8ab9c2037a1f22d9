"""Sandbox -> host messages (PROTOCOL.md): numbered, kept until acknowledged, bounded by
backpressure (THREAT_MODEL: nothing in the runtime grows without limit when the host
does not drain it)."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_tools.runtime.host_messages import HostMessages


async def test_messages_stay_until_acknowledged_so_a_lost_poll_loses_nothing() -> None:
    queue = HostMessages()
    for n in range(3):
        await queue.put("note", {"n": n})
    first = await queue.poll({"ack_seq": 0})
    again = await queue.poll({"ack_seq": 0})  # the first answer was "lost"
    assert first == again and [m["params"]["n"] for m in first["messages"]] == [0, 1, 2]
    after = await queue.poll({"ack_seq": first["seq"]})
    assert after["messages"] == [] and after["seq"] == first["seq"]


async def test_a_full_queue_pauses_the_producer_instead_of_growing() -> None:
    queue = HostMessages(max_messages=3)
    for n in range(3):
        await queue.put("note", {"n": n})
    blocked = asyncio.create_task(queue.put("note", {"n": 3}))
    await asyncio.sleep(0.2)
    assert not blocked.done()  # the producer waits: memory stays flat
    seen = await queue.poll({"ack_seq": 0})
    await queue.poll({"ack_seq": seen["seq"]})  # the host drained it
    await asyncio.wait_for(blocked, 5)
    assert [m["params"]["n"] for m in (await queue.poll({"ack_seq": 3}))["messages"]] == [3]


async def test_a_long_poll_returns_as_soon_as_a_message_arrives() -> None:
    queue = HostMessages()
    waiting = asyncio.create_task(queue.poll({"ack_seq": 0, "wait_ms": 30_000}))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await queue.put("note", {"n": 1})
    result = await asyncio.wait_for(waiting, 5)
    assert [m["seq"] for m in result["messages"]] == [1]


async def test_bad_poll_params_are_invalid_params() -> None:
    from sandbox_tools.runtime.jsonrpc import InvalidParams

    with pytest.raises(InvalidParams):
        await HostMessages().poll({"ack_seq": -1})
