"""The runtime's limits: read from the environment once, when the server starts.

Every bound an operator may change (CONFIGURATION.md, "Runtime limits") is one field of
`Limits`. The server reads them before it serves anything and hands them to each tool's
controller, so no controller looks at the environment, every part of one server uses the
same values, and a test gives a controller small limits directly. The variables' names
are in protocol.py with every other name the runtime's environment shares.

A bad value is treated as it always was, variable by variable, so a setting that used to
work still does: most fall back to their default (a typo never kept the server from
starting), while a value no bound can be made of (MAX_MCP_SESSIONS_ENV not an integer, a
byte count of "inf" or "nan"), which used to end the server with a traceback, stops it
with a `LimitsError` naming the variable, written to the server's log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox_tools.protocol import (
    BROWSER_CALL_TIMEOUT_ENV,
    BROWSER_ENV,
    BROWSER_IDLE_TIMEOUT_ENV,
    BROWSER_TREE_MAX_CHARS_ENV,
    DESKTOP_SETTLE_ENV,
    EXEC_BUFFER_BYTES_ENV,
    EXEC_RESPONSE_BYTES_ENV,
    KILL_GRACE_ENV,
    LAUNCHER_SELF_ENV,
    MAX_BROWSER_SESSIONS_ENV,
    MAX_JOBS_ENV,
    MAX_MCP_SESSIONS_ENV,
    MAX_SESSIONS_ENV,
    RESPONSE_LIMIT_MAX_DIGITS,
    RESPONSE_MAX_BYTES_ENV,
    STDIN_TIMEOUT_ENV,
    TEXT_EDITOR_MAX_BYTES_ENV,
)
from sandbox_tools.runtime.paths import BROWSER, installed_addon

# The browser web_browser starts when neither the browser add-on is installed beside the
# runtime nor BROWSER_ENV names one: Debian's Chromium headless shell, if the image has it.
DEFAULT_BROWSER = "/usr/lib/chromium/chromium-headless-shell"


class LimitsError(ValueError):
    """A limit's variable holds a value the server cannot run with."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What the server holds at most; the defaults are the documented ones."""

    # Unacknowledged output per exec_remote job; past it the job's pipes are not read, so
    # the process blocks on write (backpressure) instead of filling the server's memory.
    exec_buffer_bytes: int = 8 * 1024 * 1024
    # Output in one exec_remote_poll answer.
    exec_response_bytes: int = 2 * 1024 * 1024
    # exec_remote_kill: SIGTERM to the group, SIGKILL after this long.
    kill_grace_s: float = 2.0
    # exec_remote_write_stdin waits this long at most for the process to take its data.
    stdin_timeout_s: float = 30.0
    # exec_remote jobs held at once (running, or with output not yet collected); each may
    # buffer exec_buffer_bytes, so this bounds the server's memory for exec_remote.
    max_jobs: int = 32
    # The largest file text_editor reads or rewrites: a 32 MB create fits a 64 MiB frame.
    text_editor_max_bytes: int = 48 * 1024 * 1024
    # Bash sessions (a shell on a PTY each); past it the least recently used idle one goes.
    max_sessions: int = 16
    # MCP servers at once.
    max_mcp_sessions: int = 16
    # web_browser: the browser's executable as configured (BROWSER_ENV), and the portable
    # launcher that started us (LAUNCHER_SELF_ENV: the add-on is installed beside it). Not
    # limits, but read with them, once; `browser_executable()` chooses at each start.
    browser: str | None = None
    launcher: str | None = None
    # A browser nobody called for this long is stopped (its sessions start again on a
    # blank page at their next call), so an idle sandbox does not hold its memory.
    browser_idle_timeout_s: float = 600.0
    # Every DevTools command, and every wait for a page to load; past it the page's load
    # is an error, and a browser that does not answer a command is stopped as hung.
    browser_call_timeout_s: float = 30.0
    # The accessibility tree's text in one answer; past it the tree is cut at a line
    # and its last line says how many elements were left out.
    browser_tree_max_chars: int = 100_000
    # Browser sessions (one browser context each) at once.
    max_browser_sessions: int = 16
    # How long the desktop's screen is given to redraw before the screenshot that
    # follows an action: inspect's computer tool waits as long.
    desktop_settle_s: float = 2.0

    def reported(self) -> dict[str, int | float]:
        """The limits by field name, as `runtime_info` reports them (the browser's and
        launcher's paths are configuration, not limits, and are left out)."""
        return {
            f.name: value
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), (int, float))
        }

    def browser_executable(self) -> str:
        """The browser to start now: the add-on the host installed and verified beside
        the runtime (it may arrive after the server started), else BROWSER_ENV's, else
        the image's. The add-on comes first because the runtime's environment is partly
        the image's: an image's BROWSER_ENV must not put its own program in place of the
        browser the host sent (THREAT_MODEL.md, rule 2)."""
        return installed_addon(BROWSER, self.launcher) or self.browser or DEFAULT_BROWSER

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Limits:
        """The limits `environ` sets, the defaults for the rest; LimitsError names a
        variable whose value cannot be used (see the module's docstring for which)."""
        default = cls()
        return cls(
            exec_buffer_bytes=_count(environ, EXEC_BUFFER_BYTES_ENV, default.exec_buffer_bytes),
            exec_response_bytes=_count(
                environ, EXEC_RESPONSE_BYTES_ENV, default.exec_response_bytes
            ),
            kill_grace_s=_number(environ, KILL_GRACE_ENV, default.kill_grace_s),
            stdin_timeout_s=_number(environ, STDIN_TIMEOUT_ENV, default.stdin_timeout_s),
            max_jobs=_count(environ, MAX_JOBS_ENV, default.max_jobs),
            text_editor_max_bytes=_digits(
                environ, TEXT_EDITOR_MAX_BYTES_ENV, default.text_editor_max_bytes
            ),
            max_sessions=_digits(environ, MAX_SESSIONS_ENV, default.max_sessions),
            max_mcp_sessions=_integer(environ, MAX_MCP_SESSIONS_ENV, default.max_mcp_sessions),
            browser=environ.get(BROWSER_ENV) or None,
            launcher=environ.get(LAUNCHER_SELF_ENV) or None,
            browser_idle_timeout_s=_number(
                environ, BROWSER_IDLE_TIMEOUT_ENV, default.browser_idle_timeout_s
            ),
            browser_call_timeout_s=_number(
                environ, BROWSER_CALL_TIMEOUT_ENV, default.browser_call_timeout_s
            ),
            browser_tree_max_chars=_digits(
                environ, BROWSER_TREE_MAX_CHARS_ENV, default.browser_tree_max_chars
            ),
            max_browser_sessions=_digits(
                environ, MAX_BROWSER_SESSIONS_ENV, default.max_browser_sessions
            ),
            desktop_settle_s=_number(environ, DESKTOP_SETTLE_ENV, default.desktop_settle_s),
        )


DEFAULT_LIMITS = Limits()


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    """Any number Python's float() reads ("30", "0.5", "1e6"); anything else: the default."""
    value = environ.get(name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        return default


def _count(environ: Mapping[str, str], name: str, default: int) -> int:
    """A number of bytes or jobs read as _number, its fraction dropped; "inf" and "nan"
    are numbers but no count, and are refused."""
    try:
        return int(_number(environ, name, default))
    except (ValueError, OverflowError):
        raise LimitsError(
            f"{name}={environ.get(name)!r} is not a usable limit: give a whole number, or "
            "unset it for the default"
        ) from None


def _digits(environ: Mapping[str, str], name: str, default: int) -> int:
    """Digits only ("16"); anything else, a sign or spaces included: the default."""
    value = environ.get(name, "")
    if not value.isdigit():
        return default
    try:
        return int(value)
    except ValueError:  # digits of another script that int() does not read ("²")
        raise LimitsError(
            f"{name}={value!r} is not a usable limit: give a number in ASCII digits, or "
            "unset it for the default"
        ) from None


def _integer(environ: Mapping[str, str], name: str, default: int) -> int:
    """Any integer Python's int() reads (" 16", "+16"); anything else is refused."""
    value = environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise LimitsError(
            f"{name}={value!r} is not a usable limit: give a whole number, or unset it for "
            "the default"
        ) from None


def caller_response_limit(environ: Mapping[str, str]) -> int | None:
    """The output cap an `exec` caller set for its answer (RESPONSE_MAX_BYTES_ENV), if any.

    Not one of the server's limits: each `exec` reads its own caller's environment (the
    sandbox's exec of that one call) and passes the cap to the server with the request.
    A value that is not plain digits, or too long to be a 64-bit number, is no cap.
    """
    value = environ.get(RESPONSE_MAX_BYTES_ENV, "")
    if value.isascii() and value.isdigit() and len(value) <= RESPONSE_LIMIT_MAX_DIGITS:
        return int(value)
    return None
