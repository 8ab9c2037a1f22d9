"""Typed parameters of the text_editor method (PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    Params,
    WireParams,
    optional_or_none,
    wire,
)

Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]
COMMANDS: tuple[Command, ...] = get_args(Command)


def _view_range(params: Params, name: str) -> tuple[int, int] | None:
    view_range = optional_or_none(params, name, list)
    if view_range is None:
        return None
    if len(view_range) != 2 or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in view_range
    ):
        raise InvalidParams(f'Invalid params: field "{name}" must be [start, end] integers')
    return (view_range[0], view_range[1])


def _user(params: Params, name: str) -> UserSpec | None:
    """`user`, or `_run_as`: the name inspect_ai's text_editor host code sends it under."""
    user, run_as = parse_user(params, name), parse_user(params, "_run_as")
    if user is not None and run_as is not None and user != run_as:
        raise InvalidParams(f'Invalid params: "{name}" and "_run_as" name different identities')
    return user if user is not None else run_as


@dataclass(frozen=True, kw_only=True)
class TextEditorParams(WireParams):
    command: Command
    path: str
    view_range: tuple[int, int] | None = wire(default=None, read=_view_range)
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    user: UserSpec | None = wire(default=None, read=_user)

    def need(self, field: str) -> str:
        value = getattr(self, field)
        if value is None:
            raise InvalidParams(
                f'Invalid params: field "{field}" is required for command "{self.command}"'
            )
        return str(value)
