"""Typed parameters of the bash_session methods (PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import WireParams, wire

MAX_WAIT_S = 600
DEFAULT_MAX_OUTPUT_BYTES = 100_000


@dataclass(frozen=True, kw_only=True)
class NewSessionParams(WireParams):
    user: UserSpec | None = wire(default=None, read=parse_user)


@dataclass(frozen=True, kw_only=True)
class InteractParams(WireParams):
    session_name: str
    input: str | None = None
    restart: bool = False
    wait_for_output: float = wire(default=30.0, minimum=0, maximum=MAX_WAIT_S)
    idle_timeout: float = wire(default=0.5, minimum=0, maximum=MAX_WAIT_S)
    max_output_bytes: int = wire(default=DEFAULT_MAX_OUTPUT_BYTES, minimum=64)


@dataclass(frozen=True, kw_only=True)
class CloseSessionParams(WireParams):
    session_name: str
