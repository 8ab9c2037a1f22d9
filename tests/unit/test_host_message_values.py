"""Counting what a message costs without paying for it (THREAT_MODEL.md, rule 3).

The host's checks on sandbox output must themselves be bounded: counting the values of a
parsed MCP message stops at the cap, and the last line of an exec's output is found
without splitting the rest.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_tools.injector.jsonrpc_client import _last_line
from sandbox_tools.protocol import json_values

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

from sandbox_tools.injector.mcp_client import more_values_than

# Strings without `{`, `[` or `,`: then json_values counts exactly, not an upper bound.
PLAIN = st.text(alphabet=st.characters(blacklist_characters="{[,"), max_size=6)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | PLAIN,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(PLAIN, inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(JSON, st.integers(min_value=0, max_value=60))
def test_values_are_counted_as_the_raw_text_counts_them(value: Any, limit: int) -> None:
    assert more_values_than(value, limit) == (json_values(json.dumps(value)) > limit)


def test_counting_stops_at_the_cap_whatever_the_size() -> None:
    wide: list[Any] = [{}] * 2_000_000
    deep: list[Any] = [[{} for _ in range(1000)] for _ in range(2000)]
    started = time.perf_counter()
    assert more_values_than({"params": {"messages": wide}}, 50_000)
    assert more_values_than(deep, 50_000)
    assert not more_values_than([[1] * 100] * 400, 50_000)
    assert time.perf_counter() - started < 0.5


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"b", b" ", b"\t", b"\r", b"\n", b"\x0b", b"{"])))
def test_the_last_line_is_what_splitting_the_output_gave(parts: list[bytes]) -> None:
    output = b"".join(parts)
    lines = output.strip().splitlines()
    assert _last_line(output) == (lines[-1] if lines else b"")
