"""`--help` as a maintainer reads it: what to type, not Python types; markup that does not
eat `[tool.sandbox-tools]`; defaults stated."""

from __future__ import annotations

import re

import pytest

from tests.support import cli_help

COMMANDS = [
    [],
    ["build"],
    ["validate"],
    ["release"],
    ["fetch"],
    ["wheel"],
    ["bundle", "create"],
    ["manifest", "show"],
    ["manifest", "write"],
    ["manifest", "verify"],
    ["exec-remote"],
    ["mcp"],
    ["cleanup"],
]


def help_text(*command: str) -> str:
    done = cli_help(*command)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.replace("│", " ").split())


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "tools")
def test_metavars_say_what_to_type(command: list[str]) -> None:
    """Finding 7: typer labelled options `<bool>`, `<str>`, `<list[str]>`, `<float>`."""
    text = help_text(*command)
    assert not re.findall(r"<(bool|str|float|int|path|list\[[^>]*\])[^>]*>", text), text


def test_release_help_keeps_brackets_and_states_defaults() -> None:
    """Finding 7: rich markup ate `[tool.sandbox-tools]`, leaving an empty `` ` ` ``."""
    text = help_text("release")
    assert "from [tool.sandbox-tools] in pyproject.toml" in text
    assert "``" not in text
    assert "[default: releases/{version}]" in text and "[default: v{version}]" in text
    assert "--require DISTRO" in text and "--s3-bucket BUCKET" in text
    assert "--github-repo OWNER/NAME" in text


def test_wheel_help_says_which_manifest_is_the_default() -> None:
    text = help_text("wheel")
    assert "[default: the one `tools release` wrote into the checkout," in text
    assert "src/sandbox_tools/release/published/manifest.json]" in text


def test_flags_and_help_have_no_type_column() -> None:
    text = help_text("fetch")
    assert "--help Show this message and exit." in text
    assert "--json Print the outcome as JSON" in text
    assert "--verbose -v Name every source tried" in text
