"""inspect's providers meet our `computer()` as they meet inspect's own: ported from
inspect's tests of native computer use (tests/model/providers/test_anthropic.py's tool
version routing, tests/tools/test_openai_computer_use_transforms.py's actions), with our
tool's ToolInfo in place of the synthetic one inspect builds for its tool, and each
native action that OpenAI's transform turns into tool arguments run through our tool
(a recording desktop stands in for the runtime)."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
pytest.importorskip("openai", reason="inspect's OpenAI provider needs the openai package")
pytest.importorskip("anthropic", reason="inspect's Anthropic provider needs the anthropic package")

from inspect_ai.model._providers._openai_computer_use import (
    _parse_computer_tool_call_arguments,
    maybe_computer_use_tool,
)
from inspect_ai.model._providers.anthropic import AnthropicAPI
from inspect_ai.tool._tool_def import ToolDef
from inspect_ai.tool._tool_info import ToolInfo, parse_tool_info
from openai.types.responses import ResponseComputerToolCall
from openai.types.responses.computer_action import (
    Click,
    DoubleClick,
    Drag,
    DragPath,
    Keypress,
    Move,
    Screenshot,
    Scroll,
    Type,
    Wait,
)

from sandbox_tools.inspect.computer import computer
from tests.unit.test_inspect_computer_pure import Recording

module = importlib.import_module("sandbox_tools.inspect.computer")


def _our_tool_info() -> ToolInfo:
    tool = computer()
    info = parse_tool_info(tool)
    info.name = ToolDef(tool).name
    return info


@pytest.mark.parametrize(
    ("model_name", "expected_type"),
    [
        ("claude-opus-4-6", "computer_20251124"),
        ("claude-sonnet-4-6", "computer_20251124"),
        ("claude-sonnet-4-5", "computer_20250124"),
        ("claude-haiku-4-5", "computer_20250124"),
    ],
)
def test_anthropic_maps_our_tool_to_its_native_computer_use(
    model_name: str, expected_type: str
) -> None:
    api = AnthropicAPI(model_name=model_name, api_key="test-key")
    param = api.computer_use_tool_param(_our_tool_info())
    assert param is not None and param["type"] == expected_type


def test_openai_maps_our_tool_to_its_native_computer_use() -> None:
    assert maybe_computer_use_tool("gpt-5.4", _our_tool_info()) is not None
    assert maybe_computer_use_tool("gpt-5.4-nano", _our_tool_info()) is None


NATIVE = [
    (Click(type="click", button="left", x=100, y=200), {"action": "left_click"}),
    (Click(type="click", button="right", x=1, y=2), {"action": "right_click"}),
    (Click(type="click", button="wheel", x=1, y=2), {"action": "middle_click"}),
    (Click(type="click", button="back", x=1, y=2), {"action": "back_click"}),
    (Click(type="click", button="forward", x=1, y=2), {"action": "forward_click"}),
    (DoubleClick(type="double_click", x=3, y=4), {"action": "double_click"}),
    (
        Drag(type="drag", path=[DragPath(x=1, y=2), DragPath(x=5, y=6), DragPath(x=7, y=8)]),
        {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [7, 8]},
    ),
    (Keypress(type="keypress", keys=["CTRL", "ENTER"]), {"action": "key"}),
    (Move(type="move", x=9, y=10), {"action": "mouse_move"}),
    (Screenshot(type="screenshot"), {"action": "screenshot"}),
    (
        Scroll(type="scroll", x=5, y=6, scroll_x=0, scroll_y=300),
        {"action": "scroll", "scroll_direction": "down"},
    ),
    (Type(type="type", text="hello"), {"action": "type", "text": "hello"}),
    (Wait(type="wait"), {"action": "wait", "duration": 1}),
]


@pytest.mark.parametrize(("native", "expected"), NATIVE, ids=lambda v: getattr(v, "type", ""))
def test_each_openai_action_runs_through_our_tool(
    native: Any, expected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    call = ResponseComputerToolCall(
        id="test_id",
        actions=[native],
        call_id="call_id",
        pending_safety_checks=[],
        status="completed",
        type="computer_call",
    )
    arguments = _parse_computer_tool_call_arguments(call)
    desktop = Recording()
    monkeypatch.setattr(module, "_Desktop", lambda *_: desktop)
    asyncio.run(computer()(**arguments))
    (sent,) = desktop.sent
    assert expected.items() <= sent.items(), sent
