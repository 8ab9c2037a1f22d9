"""Typed parameters of the desktop's methods (PROTOCOL.md, "Desktop").

`computer_action` carries one of the actions inspect's in-container computer tool takes,
with the arguments inspect's host sends it (the host's `computer()` turns a model's call,
its `repeat`, `press_enter` and `actions` list, into these one at a time, as inspect's
host does). `computer_info` is ours: where the desktop add-on is, checked as the
installer's `addon-check` checks it (the browser's `browser_info` does the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from sandbox_tools.runtime.identity import UserSpec, parse_user
from sandbox_tools.runtime.jsonrpc import InvalidParams, Params, WireParams, wire

Click = Literal[
    "left_click",
    "right_click",
    "middle_click",
    "back_click",
    "forward_click",
    "double_click",
    "triple_click",
]
CLICKS: tuple[Click, ...] = get_args(Click)
ComputerAction = Literal[
    "key",
    "hold_key",
    "type",
    "cursor_position",
    "mouse_move",
    "left_mouse_down",
    "left_mouse_up",
    Click,
    "left_click_drag",
    "scroll",
    "wait",
    "screenshot",
    "zoom",
]
COMPUTER_ACTIONS: tuple[ComputerAction, ...] = get_args(ComputerAction)
ScrollDirection = Literal["up", "down", "left", "right"]
MAX_TEXT = 100_000  # characters one `type` may carry: a model's answer, not a file
MAX_DURATION = 3600  # seconds a `wait` or `hold_key` may take (the host's timeout bounds it)


def _integers(params: Params, name: str, count: int) -> list[int] | None:
    """A list of `count` integers (a point, or a region), or None where absent."""
    value = params.get(name)
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != count
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not all(-(2**31) <= v < 2**31 for v in value)
    ):
        raise InvalidParams(
            f'Invalid params: field "{name}" must be a list of {count} integers, '
            f"got {str(value)[:80]}"
        )
    return value


def _point(params: Params, name: str) -> tuple[int, int] | None:
    value = _integers(params, name, 2)
    return None if value is None else (value[0], value[1])


def _region(params: Params, name: str) -> tuple[int, int, int, int] | None:
    value = _integers(params, name, 4)
    return None if value is None else (value[0], value[1], value[2], value[3])


@dataclass(frozen=True, kw_only=True)
class ComputerParams(WireParams):
    """computer_action: one action on the desktop of `user` (started on its first)."""

    action: ComputerAction
    text: str | None = None
    coordinate: tuple[int, int] | None = wire(default=None, read=_point)
    start_coordinate: tuple[int, int] | None = wire(default=None, read=_point)
    duration: int | None = wire(default=None, minimum=0, maximum=MAX_DURATION)
    scroll_amount: int | None = wire(default=None, minimum=1, maximum=100)
    scroll_direction: ScrollDirection | None = None
    region: tuple[int, int, int, int] | None = wire(default=None, read=_region)
    # Who the desktop runs as: a terminal on it is a shell as that user, so root only
    # when asked by name; absent, the server's own user if that is not root.
    user: UserSpec | None = wire(default=None, read=parse_user)


@dataclass(frozen=True, kw_only=True)
class DesktopInfoParams(WireParams):
    """computer_info: the desktop the next action would start, without starting it.
    With `addon_dir` and `addon_digest`: the add-on there is first checked against that
    tree digest (by `addon_signature` where an earlier check gave one), as the
    installer's `addon-check` does; the host asks so only of a server running as the
    installer."""

    addon_dir: str | None = None
    addon_digest: str | None = None
    addon_signature: str | None = None
