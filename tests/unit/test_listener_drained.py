"""An answer waits for the sandbox -> host messages received before it: an MCP server's
progress went through the listener's own task, its answer through the call, and under
load (a cold test run) the SDK saw the answer first and dropped the last progress."""

from __future__ import annotations

import asyncio
from typing import Any

from sandbox_tools.injector.jsonrpc_client import Listener


def test_drained_returns_once_every_message_received_so_far_was_handled() -> None:
    async def scenario() -> list[str]:
        seen: list[str] = []

        async def slow_handler(params: dict[str, Any]) -> None:
            await asyncio.sleep(0.05)  # a busy event loop, a slow consumer
            seen.append(params["step"])

        listener = Listener("mcp", slow_handler, None, lambda _: None)
        await listener.drained(1)  # nothing received: at once
        for step in ("1", "2", "3"):
            listener.deliver({"step": step}, 10)
        await listener.drained(5)
        seen.append("answer")
        await listener.aclose()
        return seen

    assert asyncio.run(scenario()) == ["1", "2", "3", "answer"]


def test_a_stuck_handler_holds_an_answer_only_until_the_timeout_and_a_failure_not_at_all() -> None:
    async def scenario() -> tuple[float, float]:
        async def stuck(params: dict[str, Any]) -> None:
            await asyncio.Event().wait()

        listener = Listener("mcp", stuck, None, lambda _: None)
        listener.deliver({"step": "1"}, 10)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await listener.drained(0.2)
        waited = loop.time() - started
        listener.fail("the transport ended")
        started = loop.time()
        await listener.drained(5)
        after_failure = loop.time() - started
        await listener.aclose()
        return waited, after_failure

    waited, after_failure = asyncio.run(scenario())
    assert 0.15 < waited < 2 and after_failure < 1
