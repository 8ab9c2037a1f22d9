"""A params class declared once: `WireParams.parse` reads each field by its declaration
(its type, its default, its `wire()` rules beside it), and `MethodTable` serves a method
by its function's name with its params parsed by their declared type, so a tool action
spells its keys and its name once (the hand-written parses and name tables it replaced
said the same things a second time)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    MethodTable,
    Params,
    WireParams,
    required,
    wire,
)
from sandbox_tools.runtime.methods import Controllers, all_methods
from sandbox_tools.runtime.tools.bash_session.tool_types import InteractParams
from sandbox_tools.runtime.tools.exec_remote.tool_types import DEFAULT_WAIT_MS, PollParams
from sandbox_tools.runtime.tools.web_browser.tool_types import TabParams, TypeParams


def test_each_field_is_read_by_its_type_in_the_order_declared() -> None:
    params = {"session_name": "s", "element_id": 3, "text": "hi", "extra": 1}
    assert TypeParams.parse(params) == TypeParams(session_name="s", element_id=3, text="hi")
    assert TabParams.parse({"session_name": "s"}) == TabParams(session_name="s", index=None)
    assert TabParams.parse({"session_name": "s", "index": None}).index is None
    with pytest.raises(InvalidParams, match='missing required field "session_name"'):
        TypeParams.parse({"element_id": "x"})  # the first field is read first
    with pytest.raises(InvalidParams, match='field "element_id" must be integer, got str'):
        TypeParams.parse({"session_name": "s", "element_id": "3", "text": "t"})
    with pytest.raises(InvalidParams, match='field "element_id" must be integer, got bool'):
        TypeParams.parse({"session_name": "s", "element_id": True, "text": "t"})


def test_a_default_makes_a_field_optional_and_an_unplain_type_needs_its_own_parse() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Page(WireParams):
        size: int = 10
        ratio: float = 0.5

    assert Page.parse({}) == Page() and Page.parse({"ratio": 2}) == Page(ratio=2)

    @dataclass(frozen=True, kw_only=True)
    class Tags(WireParams):
        tags: tuple[str, ...]

    with pytest.raises(TypeError, match=r"Tags\.tags: .* needs wire\(read=...\)"):
        Tags.parse({"tags": ["a"]})


def test_rules_beside_a_field_bound_it_choose_it_or_read_it() -> None:
    def upper(params: Params, name: str) -> str:
        return required(params, name, str).upper()

    @dataclass(frozen=True, kw_only=True)
    class Rules(WireParams):
        mode: Literal["fast", "slow"]
        count: int = wire(default=1, minimum=1, maximum=9)
        gap: float = wire(default=0.5, minimum=0)
        name: str = wire(read=upper)

    assert Rules.parse({"mode": "fast", "name": "a"}) == Rules(mode="fast", name="A")
    assert Rules.parse({"mode": "slow", "count": 9, "gap": 2, "name": "b"}).gap == 2.0
    assert isinstance(Rules.parse({"mode": "slow", "gap": 2, "name": "b"}).gap, float)
    with pytest.raises(InvalidParams, match="\"mode\" must be one of fast, slow, got 'medium'"):
        Rules.parse({"mode": "medium", "name": "a"})
    with pytest.raises(InvalidParams, match='"count" must be between 1 and 9'):
        Rules.parse({"mode": "fast", "count": 10, "name": "a"})
    with pytest.raises(InvalidParams, match='"gap" must be >= 0'):
        Rules.parse({"mode": "fast", "gap": -0.1, "name": "a"})
    with pytest.raises(InvalidParams, match='missing required field "name"'):
        Rules.parse({"mode": "fast"})


def test_the_runtime_s_own_rules_hold_as_they_did_when_each_was_written_by_hand() -> None:
    poll = PollParams.parse({"pid": 4})
    assert (poll.ack_seq, poll.wait_ms) == (0, DEFAULT_WAIT_MS)
    assert PollParams.parse({"pid": 4, "wait_ms": 10**9}).wait_ms == 60_000  # capped
    for bad in ({"pid": 4, "ack_seq": -1}, {"pid": 4, "wait_ms": -1}):
        with pytest.raises(InvalidParams, match="must be >= 0"):
            PollParams.parse(bad)
    with pytest.raises(InvalidParams, match='"idle_timeout" must be between 0 and 600'):
        InteractParams.parse({"session_name": "s", "idle_timeout": 601})
    with pytest.raises(InvalidParams, match='"max_output_bytes" must be >= 64'):
        InteractParams.parse({"session_name": "s", "max_output_bytes": 63})
    with pytest.raises(InvalidParams, match='"index" must be >= 0'):
        TabParams.parse({"session_name": "s", "index": -1})
    # A float field given an integer of 400 digits: a clear refusal, not an OverflowError.
    with pytest.raises(InvalidParams, match='"wait_for_output" is too large a number'):
        InteractParams.parse({"session_name": "s", "wait_for_output": 10**400})


def test_a_method_is_served_by_its_function_s_name_with_its_params_parsed() -> None:
    rpc = MethodTable()
    seen: list[Any] = []

    @rpc.method
    async def tab_pick(params: TabParams) -> Any:
        seen.append(params)
        return params.index

    @rpc.method
    async def raw(params: Params) -> Any:
        return params

    @rpc.method
    async def nothing() -> Any:
        return "ok"

    assert list(rpc.methods) == ["tab_pick", "raw", "nothing"]
    assert asyncio.run(rpc.methods["tab_pick"]({"session_name": "s", "index": 2})) == 2
    assert seen == [TabParams(session_name="s", index=2)]
    assert asyncio.run(rpc.methods["raw"]({"a": 1})) == {"a": 1}
    assert asyncio.run(rpc.methods["nothing"]({"ignored": 1})) == "ok"
    with pytest.raises(InvalidParams, match='missing required field "session_name"'):
        asyncio.run(rpc.methods["tab_pick"]({}))
    with pytest.raises(ValueError, match="'raw' is registered twice"):
        rpc.add("raw", raw)

    async def untyped(params: int) -> Any:
        return params

    with pytest.raises(TypeError, match="untyped: its params are declared as 'int'"):
        rpc.method(untyped)


def test_every_runtime_method_is_registered_once(tmp_path: Any) -> None:
    """The server's table is built from every tool's registrations: a name two tools
    both claimed would fail here (and when the server starts), not shadow one of them."""
    from sandbox_tools.runtime.limits import Limits

    controllers = Controllers(Limits())
    methods = all_methods(str(tmp_path), lambda: None, controllers)
    assert {"web_go", "exec_remote_poll", "mcp_kill_server", "runtime_info"} <= set(methods)
