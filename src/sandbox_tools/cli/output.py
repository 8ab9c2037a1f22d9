"""Where the CLI writes, in one place: results, progress, and CI annotations.

Two consoles, so that the global `--quiet` can silence what is only company (progress,
stage lines, notes) while keeping what a script reads (result tables, final counts,
`--json` documents) and errors, which always go to stderr. `--json` moves everything
for humans to stderr so stdout carries the document alone: the command's, or, when the
command failed before printing it, a JSON error document (`error_document`).

On GitHub Actions (`GITHUB_ACTIONS=true`) long steps fold into `::group::` blocks,
failures become `::error::` annotations and a Markdown summary is appended to
`$GITHUB_STEP_SUMMARY`: what cibuildwheel and goreleaser users see in their logs.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from rich.console import Console


class Verbosity(enum.IntEnum):
    QUIET = 0
    NORMAL = 1
    VERBOSE = 2


def _width() -> int | None:
    # Off a terminal (CI logs, pipes) rich would wrap tables at 80 columns.
    return None if sys.stdout.isatty() else 160


console = Console(width=_width())  # results: tables, counts, paths written
notes = Console(width=_width())  # company: progress, stage lines, notes; off under --quiet
err_console = Console(stderr=True)  # errors and what to do about them
_level = Verbosity.NORMAL
_json_printed = False


def configure(level: Verbosity) -> None:
    """Set for each invocation (the root callback), so nothing leaks between runs."""
    global _level, _json_printed
    _level = level
    _json_printed = False
    for each in (console, notes):
        each.file = None  # type: ignore[assignment]  # back to the current sys.stdout
    notes.quiet = level is Verbosity.QUIET


def raise_verbosity() -> None:
    """A command's own --verbose/-v (as `tools -v CMD` would)."""
    global _level
    if _level is Verbosity.NORMAL:
        _level = Verbosity.VERBOSE


def print_json(document: Any) -> None:
    """The `--json` document on stdout (a string is printed as it is)."""
    global _json_printed
    text = document if isinstance(document, str) else json.dumps(document, indent=2) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    _json_printed = True


def json_printed() -> bool:
    return _json_printed


def error_document(message: str, remedy: str, exit_code: int) -> dict[str, Any]:
    """What `--json` prints on stdout when a command fails before its own document."""
    return {"error": message, "remedy": remedy or None, "exit_code": exit_code}


def humans_to_stderr() -> None:
    """`--json`: stdout carries the document only; tables and progress move to stderr."""
    console.file = sys.stderr
    notes.file = sys.stderr


def verbose() -> bool:
    return _level is Verbosity.VERBOSE


def quiet() -> bool:
    return _level is Verbosity.QUIET


def on_github_actions(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get("GITHUB_ACTIONS") == "true"


def one_line(text: str, limit: int = 500) -> str:
    """Annotation text: workflow commands end at the first newline."""
    return " ".join(text.split())[:limit] or "(no detail)"


def actions_error_line(title: str, message: str) -> str:
    return f"::error title={one_line(title, 100)}::{one_line(message)}"


def actions_error(title: str, message: str) -> None:
    if on_github_actions():
        print(actions_error_line(title, message), flush=True, file=notes.file)


@contextlib.contextmanager
def actions_group(title: str) -> Iterator[None]:
    """A foldable block in the Actions log (and nothing anywhere else)."""
    if not on_github_actions() or quiet():
        yield
        return
    print(f"::group::{one_line(title, 200)}", flush=True, file=notes.file)
    try:
        yield
    finally:
        print("::endgroup::", flush=True, file=notes.file)


def append_step_summary(lines: list[str]) -> None:
    """Markdown for the run's summary page, when the runner gives us one."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as summary:
            summary.write("\n".join(lines) + "\n")
