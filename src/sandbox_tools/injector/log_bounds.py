"""What the host logs of what a sandbox sends, bounded and escaped.

A sandbox can send as many messages as it likes, and inspect copies each log record into
the sample's transcript: a line (or a traceback) per message would let an agent fill the
host's log and every transcript. So a kind of event is told in full a few times, then as
a count at most once a minute; and any text that came from the sandbox is escaped and cut
before it reaches a log line, so it cannot forge lines of its own (THREAT_MODEL.md, rule 3).
"""

from __future__ import annotations

import logging
import time

TOLD_IN_FULL = 5  # the first events of a kind, each in a line of its own
SUMMARY_SECONDS = 60.0  # then a count of the rest, at most this often
MAX_SAID_CHARS = 300


def said(value: object, limit: int = MAX_SAID_CHARS) -> str:
    """`value` (from the sandbox) as it may appear in a log line: cut, every control
    character and non-ASCII character escaped (no newline, no terminal escape)."""
    text = str(value)
    cut = text[:limit]
    return ascii(cut)[1:-1] + ("..." if len(text) > limit else "")


class Throttled:
    """Warnings about one kind of event a sandbox causes: the first TOLD_IN_FULL in full,
    then a count at most every SUMMARY_SECONDS, with the latest event's text."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        summary_seconds: float = SUMMARY_SECONDS,
        level: int = logging.WARNING,
    ) -> None:
        self.log = logger
        self.what = what
        self.level = level
        self.summary_seconds = summary_seconds
        self.count = 0
        self.unsaid = 0
        self.said_at = 0.0
        self.latest = ""

    def warn(self, message: str) -> None:
        """One more event; `message` is ours (escape what came from the sandbox with
        `said`)."""
        self.count += 1
        if self.count <= TOLD_IN_FULL:
            self.log.log(self.level, "%s: %s", self.what, message)
            self.said_at = time.monotonic()
            return
        self.unsaid += 1
        self.latest = message
        if time.monotonic() - self.said_at >= self.summary_seconds:
            self.flush()

    def flush(self) -> None:
        """Tell the count of what was not told yet, if anything."""
        if self.unsaid:
            self.log.log(
                self.level,
                "%s: %d more since the last line (%d in all; the latest: %s)",
                self.what,
                self.unsaid,
                self.count,
                self.latest,
            )
            self.unsaid = 0
            self.said_at = time.monotonic()
