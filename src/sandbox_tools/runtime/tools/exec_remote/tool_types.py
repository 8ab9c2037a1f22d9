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
    optional_or_none,
    required,
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
    input: str | None
    stdin_open: bool
    env: dict[str, str] | None
    cwd: str | None
    user: UserSpec | None

    @classmethod
    def parse(cls, params: Params) -> StartParams:
        return cls(
            command=required(params, "command", str),
            input=optional_or_none(params, "input", str),
            stdin_open=optional(params, "stdin_open", bool, False),
            env=env_map(params, "env"),
            cwd=optional_or_none(params, "cwd", str),
            user=parse_user(params),
        )


def _pid(params: Params) -> int:
    return required(params, "pid", int)


def _ack_seq(params: Params) -> int:
    ack = optional(params, "ack_seq", int, 0)
    if ack < 0:
        raise InvalidParams('Invalid params: field "ack_seq" must be >= 0')
    return ack


@dataclass(frozen=True, kw_only=True)
class PollParams(WireParams):
    pid: int
    ack_seq: int
    wait_ms: int

    @classmethod
    def parse(cls, params: Params) -> PollParams:
        wait_ms = optional(params, "wait_ms", int, DEFAULT_WAIT_MS)
        if wait_ms < 0:
            raise InvalidParams('Invalid params: field "wait_ms" must be >= 0')
        return cls(pid=_pid(params), ack_seq=_ack_seq(params), wait_ms=min(wait_ms, MAX_WAIT_MS))


@dataclass(frozen=True, kw_only=True)
class AckParams(WireParams):
    """Params of kill and close_stdin: a pid and what the client has seen."""

    pid: int
    ack_seq: int

    @classmethod
    def parse(cls, params: Params) -> AckParams:
        return cls(pid=_pid(params), ack_seq=_ack_seq(params))


@dataclass(frozen=True, kw_only=True)
class WriteStdinParams(WireParams):
    pid: int
    ack_seq: int
    data: str

    @classmethod
    def parse(cls, params: Params) -> WriteStdinParams:
        return cls(pid=_pid(params), ack_seq=_ack_seq(params), data=required(params, "data", str))


class StartResult(TypedDict):
    pid: int


class OutputResult(TypedDict):
    seq: int
    stdout: str
    stderr: str


class PollResult(OutputResult):
    state: JobState
    exit_code: int | None
