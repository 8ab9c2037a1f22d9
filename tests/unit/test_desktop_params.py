"""The runtime's desktop at its edge, without a desktop: `computer_action`'s params as
the wire carries them (a point is two integers, a region four; an action outside
inspect's set, a bool for a number, a huge id: refused, naming the field), the settle
time as configured, and the limits' variable."""

from __future__ import annotations

import pytest

from sandbox_tools.protocol import DESKTOP_SETTLE_ENV
from sandbox_tools.runtime.jsonrpc import InvalidParams
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.tools.desktop.controller import MAX_SETTLE_S, _settle
from sandbox_tools.runtime.tools.desktop.tool_types import ComputerParams


def test_points_and_regions_are_lists_of_integers() -> None:
    params = ComputerParams.parse(
        {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [3, 4]}
    )
    assert (params.start_coordinate, params.coordinate) == ((1, 2), (3, 4))
    assert ComputerParams.parse({"action": "zoom", "region": [0, 0, 5, 5]}).region == (0, 0, 5, 5)
    assert params.to_params() == {
        "action": "left_click_drag",
        "start_coordinate": [1, 2],
        "coordinate": [3, 4],
    }


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"action": "fly"}, "action"),
        ({}, "action"),
        ({"action": "mouse_move", "coordinate": [1]}, "coordinate"),
        ({"action": "mouse_move", "coordinate": [1, 2, 3]}, "coordinate"),
        ({"action": "mouse_move", "coordinate": [True, 2]}, "coordinate"),
        ({"action": "mouse_move", "coordinate": [1.5, 2]}, "coordinate"),
        ({"action": "mouse_move", "coordinate": [10**20, 2]}, "coordinate"),
        ({"action": "mouse_move", "coordinate": "1,2"}, "coordinate"),
        ({"action": "zoom", "region": [0, 0, 1]}, "region"),
        ({"action": "scroll", "scroll_amount": 0}, "scroll_amount"),
        ({"action": "scroll", "scroll_direction": "sideways"}, "scroll_direction"),
        ({"action": "wait", "duration": -1}, "duration"),
        ({"action": "type", "text": 5}, "text"),
        ({"action": "screenshot", "user": 5.5}, "user"),
    ],
)
def test_a_malformed_param_is_refused_naming_it(params: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidParams, match=f'"{field}"'):
        ComputerParams.parse(params)


def test_the_settle_time_is_the_configured_one_within_bounds() -> None:
    assert Limits.from_environ({}).desktop_settle_s == 2.0
    assert Limits.from_environ({DESKTOP_SETTLE_ENV: "0.25"}).desktop_settle_s == 0.25
    assert Limits.from_environ({DESKTOP_SETTLE_ENV: "soon"}).desktop_settle_s == 2.0
    assert [_settle(s) for s in (0.5, -3.0, float("inf"), float("nan"))] == [
        0.5,
        0.0,
        MAX_SETTLE_S,
        0.0,
    ]
