"""bash_session's output: the per-session buffer, cleaning and truncation. Pure, no I/O.

- `OutputBuffer` holds what the shell wrote (decoded as UTF-8, bad bytes replaced)
  and how much of it calls have returned; past its limit the oldest is dropped, and
  the unreturned characters so lost are counted so the next result can say so;
- `clean_output` strips ANSI escape sequences and the C0 controls but tab and newline;
- `render` turns the text a call collected into its result: prompts removed, cleaned,
  truncated to its newest `max_output_bytes` bytes with a notice, notes appended.
"""

from __future__ import annotations

import codecs
import re
from typing import Literal

# ANSI escape sequences (CSI, OSC, two-byte escapes), then remaining C0 controls but \t, \n.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Unreturned output kept per session; past this the oldest is dropped (and said so).
BUFFER_CHARS = 4 * 1024 * 1024

# Why a call stopped waiting for output (bash_session/controller.py, `_collect`).
WaitEnd = Literal["prompt", "continuation", "exited", "idle", "timeout"]


def clean_output(text: str) -> str:
    text = _ANSI.sub("", text).replace("\r\n", "\n")
    return _CONTROL.sub("", text)


def truncate_tail(text: str, max_bytes: int) -> str:
    """Keep the newest `max_bytes` bytes (never a split character) with a notice."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text
    kept = encoded[-max_bytes:].decode(errors="ignore")
    dropped = len(encoded) - len(kept.encode())
    return f"[sandbox-tools: {dropped} bytes of earlier output truncated]\n{kept}"


class OutputBuffer:
    """A shell's output by absolute character offsets, bounded to its newest `limit`."""

    def __init__(self, limit: int = BUFFER_CHARS) -> None:
        self.limit = limit
        self.raw = ""
        self.base = 0  # absolute offset of raw[0]
        self.returned = 0  # absolute offset up to which output was returned
        self.dropped = 0  # unreturned chars dropped because the buffer was full
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @property
    def end(self) -> int:
        return self.base + len(self.raw)

    @property
    def unreturned(self) -> bool:
        return self.end > self.returned

    def feed(self, data: bytes, *, final: bool = False) -> None:
        """Bytes read from the terminal (`final`: there will be none after these)."""
        self.append(self._decoder.decode(data, final=final))

    def append(self, text: str) -> None:
        self.raw += text
        overflow = len(self.raw) - self.limit
        if overflow > 0:
            unreturned_lost = max(0, min(overflow, self.base + overflow - self.returned))
            self.dropped += unreturned_lost
            self.raw = self.raw[overflow:]
            self.base += overflow
            self.returned = max(self.returned, self.base)

    def text_since(self, offset: int) -> str:
        return self.raw[max(0, offset - self.base) :]

    def skip(self) -> None:
        """Count everything so far as returned (a start-up banner is nobody's output)."""
        self.returned = self.end

    def take(self) -> tuple[str, int]:
        """The output not returned yet, and how many characters of it were dropped."""
        text = self.text_since(self.returned)
        self.returned = self.end
        dropped, self.dropped = self.dropped, 0
        return text, dropped


def render(
    text: str,
    *,
    prompts: tuple[str, str],
    dropped: int,
    ended: WaitEnd,
    exit_code: int | None,
    input_given: bool,
    max_output_bytes: int,
) -> str:
    """A call's result: `text` without the prompt tokens, cleaned, truncated, with notes."""
    ps1, ps2 = prompts
    text = clean_output(text.replace(ps1, "").replace(ps2, ""))
    notes = []
    if dropped:
        notes.append(f"{dropped} characters of output were dropped (buffer full)")
    if ended == "continuation":
        notes.append(
            "the shell is waiting for more input (an unfinished quote, bracket or "
            "here-document?): send the rest of the command, or restart the session"
        )
    elif ended == "exited":
        notes.append(
            f"the shell exited with code {exit_code}; restart the session "
            "(restart: true) to get a new one"
        )
    elif ended in ("timeout", "idle") and input_given:
        notes.append(
            "no prompt yet: the command is still running or waiting for input; call "
            "again to read more output, send input, or restart the session"
        )
    text = truncate_tail(text, max_output_bytes)
    if notes:
        separator = "" if not text or text.endswith("\n") else "\n"
        text += separator + "".join(f"[sandbox-tools: {note}]\n" for note in notes)
    return text
