"""validate's table: failures first, a done/total count, and a live view that
never grows taller than the screen."""

from __future__ import annotations

from rich.console import Console

from sandbox_tools.cli.validate_cmd import _table
from sandbox_tools.validation import CellResult, CellStatus


def cell(distro: str, status: str) -> CellResult:
    return CellResult(
        artifact="a",
        platform="linux/amd64",
        distro=distro,
        scenario="root",
        status=CellStatus(status),
    )


def render(table: object) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_failures_come_first_with_a_done_count() -> None:
    results = [cell("alpha", "passed"), cell("beta", "skipped"), cell("gamma", "failed")]
    text = render(_table(results, total=10))
    assert "3/10 done" in text
    assert text.index("gamma") < text.index("alpha") < text.index("beta")


def test_the_live_view_is_cut_to_the_screen_and_says_so() -> None:
    results = [cell(f"d{n:02d}", "passed") for n in range(30)] + [cell("zz", "failed")]
    text = render(_table(results, total=31, rows=5))
    assert "zz" in text  # the failure is never the part cut off
    assert "and 26 more" in text and "d29" not in text
