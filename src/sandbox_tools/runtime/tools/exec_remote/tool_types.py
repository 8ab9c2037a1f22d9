"""Typed parameters and results of the exec_remote methods (PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict, get_args

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    Params,
    WireParams,
    env_map,
    optional,
    wire,
)

JobState = Literal["running", "completed", "killed"]
# The job states by name, taken from the wire type so they cannot drift from it: the
# runtime reports them and the host reads them through these, never through literals.
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
RUNNING: JobState
COMPLETED: JobState
KILLED: JobState
RUNNING, COMPLETED, KILLED = JOB_STATES

# Long polls are capped so a forgotten client cannot pin a connection forever.
MAX_WAIT_MS = 60_000
# A poll without `wait_ms` still waits this long for news (output or the end). inspect_ai's
# client sleeps at least 5 s between polls, so without it a command ending 10 ms after a
# quick poll was reported 5 s late; its own slower runtime hid this. Explicit 0: no wait.
DEFAULT_WAIT_MS = 1_000


@dataclass(frozen=True, kw_only=True)
class StartParams(WireParams):
    command: str
    input: str | None = None
    stdin_open: bool = False
    env: dict[str, str] | None = wire(default=None, read=env_map)
    cwd: str | None = None
    user: UserSpec | None = wire(default=None, read=parse_user)


def _wait_ms(params: Params, name: str) -> int:
    """A long poll's wait: DEFAULT_WAIT_MS when absent, capped at MAX_WAIT_MS."""
    wait_ms = optional(params, name, int, DEFAULT_WAIT_MS)
    if wait_ms < 0:
        raise InvalidParams(f'Invalid params: field "{name}" must be >= 0')
    return min(wait_ms, MAX_WAIT_MS)


@dataclass(frozen=True, kw_only=True)
class PollParams(WireParams):
    pid: int
    ack_seq: int = wire(default=0, minimum=0)
    wait_ms: int = wire(default=DEFAULT_WAIT_MS, read=_wait_ms)


@dataclass(frozen=True, kw_only=True)
class AckParams(WireParams):
    """Params of kill and close_stdin: a pid and what the client has seen."""

    pid: int
    ack_seq: int = wire(default=0, minimum=0)


@dataclass(frozen=True, kw_only=True)
class WriteStdinParams(WireParams):
    pid: int
    ack_seq: int = wire(default=0, minimum=0)
    data: str


class StartResult(TypedDict):
    pid: int


class OutputResult(TypedDict):
    seq: int
    stdout: str
    stderr: str


class PollResult(OutputResult):
    state: JobState
    exit_code: int | None
