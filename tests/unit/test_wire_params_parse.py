"""A params class declared once: `WireParams.parse` reads each field by its declared type,
so a plain class spells its keys only in its fields (the hand-written parses it replaced
said the same things a second time)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sandbox_tools.runtime.jsonrpc import InvalidParams, WireParams
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

    with pytest.raises(TypeError, match=r"Tags\.tags: .* needs a parse of its own"):
        Tags.parse({"tags": ["a"]})
