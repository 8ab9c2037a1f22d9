"""Host listeners for sandbox -> host messages: bounded per listener and per client,
and a listener is only ever held to account for its own messages (THREAT_MODEL.md,
"Sandbox -> host surfaces": one MCP session cannot stop another)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox_tools.injector import jsonrpc_client
from sandbox_tools.injector.jsonrpc_client import RuntimeClient


class Client(RuntimeClient):
    """Only the routing under test: messages are handed to `_dispatch` directly."""

    async def _start_listening(self) -> None:
        pass

    async def call(self, method: str, params: Any = None, timeout: float = 1) -> Any:
        raise NotImplementedError


@pytest.mark.security
async def test_the_client_wide_bound_fails_only_the_listener_the_message_is_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jsonrpc_client, "CLIENT_LISTENER_BYTES", 1000)
    stuck = asyncio.Event()

    async def slow(params: dict[str, Any]) -> None:
        await stuck.wait()

    client = Client()
    quiet = await client.listen("mcp", slow, accepts=lambda p: p.get("tag") == "quiet")
    flood = await client.listen("mcp", slow, accepts=lambda p: p.get("tag") == "flood")
    for _ in range(2):  # each now has one message in its handler and one waiting
        client._dispatch({"method": "mcp", "params": {"tag": "quiet"}}, 100)
        client._dispatch({"method": "mcp", "params": {"tag": "flood"}}, 100)
        await asyncio.sleep(0)
    for _ in range(10):
        client._dispatch({"method": "mcp", "params": {"tag": "flood"}}, 300)
    assert flood.failed is not None and "fell behind" in flood.failed
    assert quiet.failed is None
    stuck.set()
    await quiet.aclose()
    await flood.aclose()


@pytest.mark.security
async def test_a_handler_that_fails_on_every_message_is_counted_not_a_traceback_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """THREAT_MODEL.md rule 3: what a sandbox sends may fail a handler every time; the
    host logged a traceback per message. Now the first few are told, escaped (a message
    cannot forge log lines), then counted."""
    import logging

    async def fails(params: dict[str, Any]) -> None:
        raise ValueError(f"bad {params['name']}")

    caplog.set_level(logging.INFO)
    client = Client()
    listener = await client.listen("mcp", fails)
    for n in range(200):
        client._dispatch({"method": "mcp", "params": {"name": f"x{n}\nforged line"}}, 10)
    for _ in range(50):
        await asyncio.sleep(0)
    await listener.aclose()
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(records) <= 6
    assert not [r for r in records if r.exc_info]
    assert not [r for r in records if "\n" in r.getMessage()]


def test_text_from_the_sandbox_is_escaped_and_cut_for_the_log() -> None:
    from sandbox_tools.injector.log_bounds import said

    assert said("a\nb\x1b[31mc") == "a\\nb\\x1b[31mc"
    assert said("é" * 500, 10) == "\\xe9" * 10 + "..."


def test_a_runtime_naming_a_new_server_each_time_is_counted_not_a_warning_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A runtime the agent controls named a new server in every poll's answer: a WARNING
    each (265 in 15 s)."""
    import logging

    caplog.set_level(logging.INFO)
    client = Client()
    for n in range(300):
        client._note_server(f"server-{n}\nforged")
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(records) <= 6
    assert not [r for r in records if "\n" in r.getMessage()]
