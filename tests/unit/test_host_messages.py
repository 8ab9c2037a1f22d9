"""Sandbox -> host messages (PROTOCOL.md): numbered, kept until acknowledged, bounded by
backpressure (THREAT_MODEL: nothing in the runtime grows without limit when the host
does not drain it)."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_tools.runtime.host_messages import HostMessageRefused, HostMessages
from sandbox_tools.runtime.jsonrpc import ToolError

KEY = "k" * 32


async def test_messages_stay_until_acknowledged_so_a_lost_poll_loses_nothing() -> None:
    queue = HostMessages()
    for n in range(3):
        await queue.put("note", {"n": n})
    first = await queue.poll({"key": KEY, "ack_seq": 0})
    again = await queue.poll({"key": KEY, "ack_seq": 0})  # the first answer was "lost"
    assert first == again and [m["params"]["n"] for m in first["messages"]] == [0, 1, 2]
    after = await queue.poll({"key": KEY, "ack_seq": first["seq"]})
    assert after["messages"] == [] and after["seq"] == first["seq"]


async def test_a_full_queue_pauses_the_producer_instead_of_growing() -> None:
    queue = HostMessages(max_messages=3)
    for n in range(3):
        await queue.put("note", {"n": n})
    blocked = asyncio.create_task(queue.put("note", {"n": 3}))
    await asyncio.sleep(0.2)
    assert not blocked.done()  # the producer waits: memory stays flat
    seen = await queue.poll({"key": KEY, "ack_seq": 0})
    await queue.poll({"key": KEY, "ack_seq": seen["seq"]})  # the host drained it
    await asyncio.wait_for(blocked, 5)
    assert [
        m["params"]["n"] for m in (await queue.poll({"key": KEY, "ack_seq": 3}))["messages"]
    ] == [3]


async def test_a_long_poll_returns_as_soon_as_a_message_arrives() -> None:
    queue = HostMessages()
    waiting = asyncio.create_task(queue.poll({"key": KEY, "ack_seq": 0, "wait_ms": 30_000}))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await queue.put("note", {"n": 1})
    result = await asyncio.wait_for(waiting, 5)
    assert [m["seq"] for m in result["messages"]] == [1]


async def test_bad_poll_params_are_invalid_params() -> None:
    from sandbox_tools.runtime.jsonrpc import InvalidParams

    with pytest.raises(InvalidParams):
        await HostMessages().poll({"key": KEY, "ack_seq": -1})


@pytest.mark.security
async def test_a_flooding_source_waits_on_its_own_share_and_others_keep_their_turn() -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces": one MCP session (or the proxy) cannot
    starve or block another; each source has its own bound in count and bytes."""
    queue = HostMessages(source_messages=3, source_bytes=10_000)
    for n in range(3):
        await queue.put("mcp", {"n": n}, "mcp:1")
    flood = asyncio.create_task(queue.put("mcp", {"n": 3}, "mcp:1"))
    await asyncio.sleep(0.1)
    assert not flood.done()  # the flooder waits on its own share...
    await asyncio.wait_for(queue.put("http", {"r": 1}, "http"), 1)  # ...the others do not
    seen = await queue.poll({"key": KEY})
    assert [m["method"] for m in seen["messages"]] == ["mcp"] * 3 + ["http"]
    await queue.poll({"key": KEY, "ack_seq": seen["seq"]})
    await asyncio.wait_for(flood, 1)
    # A byte share too: one big message fills it for that source alone.
    queue = HostMessages(source_bytes=2_000)
    await queue.put("mcp", {"data": "x" * 1500}, "mcp:1")
    big = asyncio.create_task(queue.put("mcp", {"data": "x" * 1500}, "mcp:1"))
    await asyncio.sleep(0.1)
    assert not big.done()
    await asyncio.wait_for(queue.put("mcp", {"data": "x" * 1500}, "mcp:2"), 1)
    big.cancel()


@pytest.mark.security
async def test_a_message_that_grows_past_the_limit_when_encoded_is_refused_at_the_producer() -> (
    None
):
    """THREAT_MODEL.md "Sandbox -> host surfaces": an oversized message is refused where it
    is made, never left at the head of the queue (a string of 'é' grows 6x as JSON)."""
    queue = HostMessages(max_message_bytes=4_000)
    with pytest.raises(HostMessageRefused, match="larger than"):
        await queue.put("mcp", {"data": "é" * 1000}, "mcp:1")  # 2 KB of UTF-8, 6 KB as JSON
    with pytest.raises(HostMessageRefused, match="not valid JSON"):
        await queue.put("mcp", {"data": float("nan")}, "mcp:1")
    await asyncio.wait_for(queue.put("mcp", {"data": "ok"}, "mcp:1"), 1)  # nothing is stuck
    assert [m["params"] for m in (await queue.poll({"key": KEY}))["messages"]] == [{"data": "ok"}]


async def test_a_poll_answer_is_bounded_in_bytes() -> None:
    queue = HostMessages()
    for n in range(4):
        await queue.put("mcp", {"data": "x" * (15 * 1024 * 1024)}, f"mcp:{n}")
    result = await queue.poll({"key": KEY})
    assert len(result["messages"]) == 3  # 45 MiB fit in a 48 MiB answer, a 4th would not


@pytest.mark.security
async def test_only_the_owner_receives_and_answers_and_a_second_client_is_refused() -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces": a second client of the runtime (an agent
    with its uid) cannot take the host's messages over or answer in its place."""
    queue = HostMessages(owner_lease=0.3)
    await queue.poll({"key": KEY})
    with pytest.raises(ToolError, match="another client receives"):
        await queue.poll({"key": "a" * 32})
    with pytest.raises(ToolError, match="only the client"):
        queue.check_owner("a" * 32)
    queue.check_owner(KEY)
    with pytest.raises(Exception, match="16 to 128"):
        await queue.poll({})
    # Released by its owner, or not seen for the lease: the next client may claim it.
    await queue.release({"key": KEY})
    await queue.poll({"key": "a" * 32})
    await asyncio.sleep(0.4)
    await queue.poll({"key": KEY})
    assert (await queue.poll({"key": KEY}))["server"] == queue.instance


@pytest.mark.security
async def test_a_quiet_sources_small_message_is_not_starved_by_floods() -> None:
    """THREAT_MODEL.md "Sandbox -> host surfaces": producers that lose the race for room
    wait again at the back; a quiet source's small message (a model-proxy request) enters
    at once even while flooders keep the queue over its overall bound."""
    queue = HostMessages(max_bytes=3_000_000)
    await queue.put("mcp", {"data": "x" * 2_000_000}, "mcp:1")
    flooders = [
        asyncio.create_task(queue.put("mcp", {"data": "x" * 2_000_000}, f"mcp:{n}")) for n in (2, 3)
    ]
    await asyncio.sleep(0.1)
    assert not any(f.done() for f in flooders)
    await asyncio.wait_for(queue.put("http", {"request_id": "h1"}, "http"), 1)
    for flooder in flooders:
        flooder.cancel()


@pytest.mark.security
async def test_json_that_costs_far_more_as_objects_is_counted_by_its_cost() -> None:
    """THREAT_MODEL.md rule 3: `[{},{},...]` is counted at what it costs parsed, and a
    message of more than a million values is refused where it is made."""
    queue = HostMessages(source_bytes=10_000_000)
    dense = [{}] * 300_000  # 900 KB as JSON, ~29 MB as counted
    await queue.put("mcp", {"data": dense}, "mcp:1")
    second = asyncio.create_task(queue.put("mcp", {"data": dense}, "mcp:1"))
    await asyncio.sleep(0.1)
    assert not second.done()  # its share is full after one
    second.cancel()
    with pytest.raises(HostMessageRefused, match="JSON values"):
        await queue.put("mcp", {"data": [{}] * 1_100_000}, "mcp:2")
