"""Typed parameters of the text_editor method (PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import (
    InvalidParams,
    Params,
    WireParams,
    optional_or_none,
    required,
)

Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]
COMMANDS: tuple[Command, ...] = ("view", "create", "str_replace", "insert", "undo_edit")


@dataclass(frozen=True, kw_only=True)
class TextEditorParams(WireParams):
    command: Command
    path: str
    view_range: tuple[int, int] | None
    file_text: str | None
    old_str: str | None
    new_str: str | None
    insert_line: int | None
    user: UserSpec | None

    @classmethod
    def parse(cls, params: Params) -> TextEditorParams:
        command = required(params, "command", str)
        if command not in COMMANDS:
            raise InvalidParams(
                f'Invalid params: field "command" must be one of {", ".join(COMMANDS)}, '
                f"got {command!r}"
            )
        view_range = optional_or_none(params, "view_range", list)
        if view_range is not None and (
            len(view_range) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in view_range)
        ):
            raise InvalidParams('Invalid params: field "view_range" must be [start, end] integers')
        return cls(
            command=command,
            path=required(params, "path", str),
            view_range=(view_range[0], view_range[1]) if view_range else None,
            file_text=optional_or_none(params, "file_text", str),
            old_str=optional_or_none(params, "old_str", str),
            new_str=optional_or_none(params, "new_str", str),
            insert_line=optional_or_none(params, "insert_line", int),
            user=_user(params),
        )

    def need(self, field: str) -> str:
        value = getattr(self, field)
        if value is None:
            raise InvalidParams(
                f'Invalid params: field "{field}" is required for command "{self.command}"'
            )
        return str(value)


def _user(params: Params) -> UserSpec | None:
    """`user`, or `_run_as`: the name inspect_ai's text_editor host code sends it under."""
    user, run_as = parse_user(params), parse_user(params, "_run_as")
    if user is not None and run_as is not None and user != run_as:
        raise InvalidParams('Invalid params: "user" and "_run_as" name different identities')
    return user if user is not None else run_as
