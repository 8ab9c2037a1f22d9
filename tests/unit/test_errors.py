"""Errors: one message, one remedy, each rendered once (users saw a remedy twice when one
error's text, remedy included, was wrapped in another's)."""

from __future__ import annotations

import pytest

from sandbox_tools.errors import (
    RuntimeRpcError,
    RuntimeTransportError,
    SandboxInjectionError,
    ToolError,
)
from sandbox_tools.protocol import ErrorReason


def test_the_text_of_an_error_is_its_message_and_the_remedy_is_apart() -> None:
    inner = RuntimeTransportError("runtime_info: no answer")
    assert str(inner) == "runtime_info: no answer"
    assert inner.remedy.startswith("The runtime in the sandbox did not answer")
    assert inner.explained() == f"runtime_info: no answer. {inner.remedy}"
    assert SandboxInjectionError("done.", remedy="").explained() == "done."
    assert SandboxInjectionError("ends.", remedy="Do X.").explained() == "ends. Do X."


def test_a_wrapped_error_shows_each_remedy_once_on_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandbox_tools.cli import app as cli

    inner = RuntimeTransportError("runtime_info: no answer")

    def wrapped() -> None:
        raise SandboxInjectionError(f"the runtime did not answer: {inner}", remedy="Look at X.")

    monkeypatch.setattr(cli, "app", wrapped)
    with pytest.raises(SystemExit):
        cli.main()
    err = capsys.readouterr().err
    assert err.count("did not answer") == 1  # the inner message, once
    assert inner.remedy[:30] not in err  # the inner remedy is not carried into the outer text
    assert err.count("Look at X.") == 1


def test_a_tool_error_has_one_text() -> None:
    error = ToolError(-32099, "no such file: /x")
    assert str(error) == error.message == "no such file: /x"
    assert error.args == ("no such file: /x",)
    other = RuntimeRpcError(-32603, "boom")
    assert str(other) == other.message == "runtime error -32603: boom"


def test_an_uncaught_error_shows_its_remedy_once_as_a_note() -> None:
    """A library caller (not the CLI) sees the remedy under the message in a traceback;
    wrapping the error in another's text still carries the message only."""
    import sys
    import traceback

    error = SandboxInjectionError("no artifact", remedy="Run tools build --out dist.")
    shown = "".join(traceback.format_exception(error))
    if sys.version_info >= (3, 11):
        assert shown.count("Run tools build --out dist.") == 1
    assert "Run tools build" not in f"wrapped: {error}"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"reason": "session_gone"}, ErrorReason.SESSION_GONE),
        ({"reason": "too_many"}, ErrorReason.TOO_MANY),
        ({"reason": "a reason from a later runtime"}, None),
        ({"reason": ["session_gone"]}, None),
        ("session_gone", None),
        (None, None),
    ],
)
def test_a_tool_errors_reason_is_read_from_its_data_and_an_unknown_one_is_none(
    data: object, reason: ErrorReason | None
) -> None:
    """Host logic decides on `data.reason` alone; whatever else the runtime put there (the
    runtime is untrusted) reads as no reason, never as an error of its own."""
    assert ToolError(-32099, "no bash session named 'x'", data).reason is reason
