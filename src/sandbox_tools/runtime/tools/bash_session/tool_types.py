"""Typed parameters of the bash_session methods (PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    Params,
    WireParams,
    optional,
    optional_or_none,
    required,
)

MAX_WAIT_S = 600
DEFAULT_MAX_OUTPUT_BYTES = 100_000


@dataclass(frozen=True, kw_only=True)
class NewSessionParams(WireParams):
    user: UserSpec | None

    @classmethod
    def parse(cls, params: Params) -> NewSessionParams:
        return cls(user=parse_user(params))


@dataclass(frozen=True, kw_only=True)
class InteractParams(WireParams):
    session_name: str
    input: str | None
    restart: bool
    wait_for_output: float
    idle_timeout: float
    max_output_bytes: int

    @classmethod
    def parse(cls, params: Params) -> InteractParams:
        wait = optional(params, "wait_for_output", float, 30.0)
        idle = optional(params, "idle_timeout", float, 0.5)
        max_bytes = optional(params, "max_output_bytes", int, DEFAULT_MAX_OUTPUT_BYTES)
        for name, value in (("wait_for_output", wait), ("idle_timeout", idle)):
            if value < 0 or value > MAX_WAIT_S:
                raise InvalidParams(
                    f'Invalid params: field "{name}" must be between 0 and {MAX_WAIT_S}'
                )
        if max_bytes < 64:
            raise InvalidParams('Invalid params: field "max_output_bytes" must be >= 64')
        return cls(
            session_name=required(params, "session_name", str),
            input=optional_or_none(params, "input", str),
            restart=optional(params, "restart", bool, False),
            wait_for_output=float(wait),
            idle_timeout=float(idle),
            max_output_bytes=max_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class CloseSessionParams(WireParams):
    session_name: str

    @classmethod
    def parse(cls, params: Params) -> CloseSessionParams:
        return cls(session_name=required(params, "session_name", str))
