"""Reference tables that restate the code: docs/CONFIGURATION.md's settings table is
generated from `sandbox_tools.settings.SETTINGS` (this test prints the table to paste
when the two differ), so is docs/PROTOCOL.md's table of error reasons from
`sandbox_tools.protocol.ERROR_REASONS`, and docs/CLI.md lists the commands `tools` has."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_tools.protocol import ERROR_REASONS, ErrorReason
from sandbox_tools.settings import SETTINGS
from tests.docs.blocks import ROOT

CONFIGURATION = ROOT / "docs" / "CONFIGURATION.md"
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)) and not value:
        return "none"
    return f"`{value}`"


def settings_table() -> str:
    rows = [f"| `{s.env}` | `{s.key}` | {_default(s.default)} | {s.doc} |" for s in SETTINGS]
    return "\n".join(["| variable | key | default | effect |", "|---|---|---|---|", *rows])


def test_the_settings_table_is_generated_from_the_settings() -> None:
    table = settings_table()
    assert table in CONFIGURATION.read_text(), (
        f"{CONFIGURATION.relative_to(ROOT)}: the settings table differs from SETTINGS; "
        f"paste this:\n\n{table}\n"
    )


def error_reasons_table() -> str:
    rows = [f"| `{reason.value}` | {meaning} |" for reason, meaning in ERROR_REASONS.items()]
    return "\n".join(["| `data.reason` | meaning |", "|---|---|", *rows])


def test_the_error_reasons_table_is_generated_from_the_protocol() -> None:
    assert set(ERROR_REASONS) == set(ErrorReason), "every reason has its meaning"
    table = error_reasons_table()
    assert table in PROTOCOL.read_text(), (
        f"{PROTOCOL.relative_to(ROOT)}: the error reasons differ from ERROR_REASONS; "
        f"paste this:\n\n{table}\n"
    )


def test_the_protocol_names_every_method_and_the_browser_pages_every_mcp_tool() -> None:
    """The method tables of PROTOCOL.md and the browser's MCP tool lists are written by
    hand: each name the runtime serves must be in them (one was missing)."""
    from sandbox_tools.runtime.limits import Limits
    from sandbox_tools.runtime.methods import Controllers, all_methods
    from sandbox_tools.runtime.tools.web_browser.mcp_tools import TOOLS

    methods = all_methods("/nonexistent", lambda: None, Controllers(Limits()))
    protocol = PROTOCOL.read_text()
    assert not [m for m in methods if f"`{m}`" not in protocol], "PROTOCOL.md lacks methods"
    for page in ("INJECTION.md", "INSPECT.md"):
        text = (ROOT / "docs" / page).read_text()
        missing = [tool.name for tool in TOOLS if f"`{tool.name}`" not in text]
        assert not missing, f"docs/{page} does not list the browser MCP tools {missing}"


def test_the_browser_pages_list_every_inspect_tool_and_every_page_action() -> None:
    """INSPECT.md's `web_browser()` list and INJECTION.md's `BrowserSession` page actions
    are prose: each tool `web_browser()` makes and each method answering a page is named."""
    import inspect as python_inspect
    import typing

    pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
    from inspect_ai.tool import ToolDef

    from sandbox_tools.injector.web_browser import BrowserPage, BrowserSession
    from sandbox_tools.inspect.browser import web_browser

    text = (ROOT / "docs" / "INSPECT.md").read_text()
    missing = [n for n in (ToolDef(t).name for t in web_browser()) if f"`{n}(" not in text]
    assert not missing, f"docs/INSPECT.md does not list the web_browser() tools {missing}"
    actions = [
        name
        for name, method in vars(BrowserSession).items()
        if not name.startswith("_")
        and python_inspect.iscoroutinefunction(method)
        and typing.get_type_hints(method).get("return") is BrowserPage
    ]
    assert "go" in actions and "scroll" in actions
    text = (ROOT / "docs" / "INJECTION.md").read_text()
    missing = [name for name in actions if f"`{name}`" not in text and f"`{name}(" not in text]
    assert not missing, f"docs/INJECTION.md does not list the page actions {missing}"


def test_the_cli_reference_names_every_command() -> None:
    import typer.main

    from sandbox_tools.cli.app import app

    text = (ROOT / "docs" / "CLI.md").read_text()
    for name in typer.main.get_command(app).commands:
        assert f"`tools {name}" in text, f"docs/CLI.md does not describe `tools {name}`"


def test_the_settings_page_is_where_the_readme_says() -> None:
    assert "docs/CONFIGURATION.md" in (ROOT / "README.md").read_text()
