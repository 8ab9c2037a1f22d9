"""text_editor's line arithmetic works on offsets (no per-line objects); it must agree
with the obvious split-based definitions on any text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_tools.runtime.tools.text_editor.controller import _line_offset, numbered

texts = st.text(alphabet=st.sampled_from("ab\n\u00e9"), max_size=300)


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(1, 400))
def test_line_offset_matches_splitting(body: str, line: int) -> None:
    lines = body.split("\n")
    expected = len("".join(f"{x}\n" for x in lines[: line - 1])) if line <= len(lines) else None
    offset = _line_offset(body, line)
    if expected is None:
        assert offset == len(body) + 1
    else:
        assert offset == expected


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(1, 50), st.integers(0, 60))
def test_numbered_matches_cat_n(text: str, first: int, extra: int) -> None:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if first > len(lines):
        return
    last = min(len(lines), first + extra)
    expected = "".join(f"{n:6}\t{lines[n - 1]}\n" for n in range(first, last + 1))
    assert numbered(text, first, last) == expected
