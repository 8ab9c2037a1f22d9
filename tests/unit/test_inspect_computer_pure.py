"""`sandbox_tools.inspect.computer()` without a sandbox: inspect's own judgement that it is
the computer tool (so providers substitute their native computer use), inspect's key-name
normalisation compared with ours on every name either table knows, the answers in
inspect's shapes, `repeat` and `max_screenshots`, and a model's call taken apart into the
runtime's primitive actions as inspect's host takes it apart (a recording desktop stands
in for the runtime)."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from inspect_ai.tool import ContentImage, ContentText, ToolError
from inspect_ai.tool._tool import TOOL_INIT_MODEL_INPUT, ToolParsingError
from inspect_ai.tool._tool_def import ToolDef
from inspect_ai.tool._tool_info import parse_tool_info
from inspect_ai.tool._tools._computer import _common as inspects
from inspect_ai.tool._tools._computer._computer import is_computer_tool_info

from sandbox_tools.inspect.computer import _answer, _Desktop, _repeat, computer, xdotool_keys

# The module, not the tool the package exports under its name.
module = importlib.import_module("sandbox_tools.inspect.computer")
PNG64 = "iVBORw0KGgo="


def test_inspect_takes_it_for_its_computer_tool_and_it_never_runs_in_parallel() -> None:
    tool = computer()
    info = parse_tool_info(tool)
    info.name = ToolDef(tool).name
    assert info.name == "computer" and is_computer_tool_info(info)
    from inspect_ai._util.registry import registry_info

    assert registry_info(tool).metadata["parallel"] is False


def test_key_names_are_normalised_as_inspects_host_does() -> None:
    names = [*inspects._KEY_ALIASES, *inspects._KEY_ALIASES.values()]
    samples = [
        *names,
        *(n.upper() for n in names),
        *(f"ctrl+{n}" for n in names),
        "a",
        "A",
        "ctrl+A",
        "shift+a b",
        "Page_Down",
        "unknown_key",
        "  Return   ctrl+S ",
        "+",
        "ctrl++",
    ]
    assert [xdotool_keys(s) for s in samples] == [inspects._normalize_key_text(s) for s in samples]


def test_the_answers_have_inspects_shapes() -> None:
    image = ContentImage(image=f"data:image/png;base64,{PNG64}")
    assert _answer({"output": "X=1,Y=2", "error": "", "base64_image": None}) == "X=1,Y=2"
    assert _answer({"output": "", "error": "", "base64_image": PNG64}) == [image]
    assert _answer({"output": "typed", "error": "", "base64_image": PNG64}) == [
        ContentText(text="typed"),
        image,
    ]
    assert _answer({"output": "", "error": "", "base64_image": None}) == "OK"
    with pytest.raises(ToolError, match="Coordinates 2000, 10 are out of bounds"):
        _answer({"output": "", "error": "Coordinates 2000, 10 are out of bounds"})


def test_repeat_is_checked_before_any_key_is_pressed() -> None:
    assert [_repeat(v) for v in (1, 100, 3.0, "7")] == [1, 100, 3, 7]
    for bad in (0, 101, -1, "x", 2.5, True, None, [3]):
        with pytest.raises(ToolParsingError):
            _repeat(bad)


def test_only_the_latest_screenshots_are_played_back() -> None:
    execute = computer(max_screenshots=2)
    model_input = getattr(execute, TOOL_INIT_MODEL_INPUT)
    shot = [ContentText(text="moved"), ContentImage(image=f"data:image/png;base64,{PNG64}")]
    hints: Any = {}
    assert model_input(8, 10, shot, hints) == shot  # the last two keep theirs
    old = model_input(7, 10, shot, hints)
    assert old[0] == shot[0] and isinstance(old[1], ContentText)
    assert "Screenshot removed" in old[1].text
    assert model_input(0, 10, "text only", hints) == "text only"
    no_truncation: Any = {"disable_computer_screenshot_truncation": True}
    assert model_input(0, 10, shot, no_truncation) == shot
    assert not hasattr(computer(max_screenshots=None), TOOL_INIT_MODEL_INPUT)


class Recording(_Desktop):
    """The runtime's side: each primitive action recorded, answered with its name."""

    def __init__(self) -> None:
        super().__init__(None, None, 180)
        self.sent: list[dict[str, Any]] = []

    async def act(self, args: dict[str, Any]) -> Any:
        self.sent.append(args)
        return args["action"]


def _run(monkeypatch: pytest.MonkeyPatch, **call: Any) -> tuple[Any, list[dict[str, Any]]]:
    desktop = Recording()
    monkeypatch.setattr(module, "_Desktop", lambda *_: desktop)
    result = asyncio.run(computer()(**call))
    return result, desktop.sent


def test_a_models_call_becomes_the_primitive_actions_inspects_host_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, sent = _run(monkeypatch, action="key", text="ctrl+ENTER", repeat=3)
    assert sent == [{"action": "key", "text": "ctrl+Return"}] * 3 and result == "key"
    _, sent = _run(monkeypatch, action="type", text="hi", coordinate=[5, 6], press_enter=True)
    assert sent == [
        {"action": "left_click", "coordinate": [5, 6]},
        {"action": "type", "text": "hi"},
        {"action": "key", "text": "Return"},
    ]
    _, sent = _run(monkeypatch, action="hold_key", text="shift", duration=1)
    assert sent == [{"action": "hold_key", "text": "shift", "duration": 1}]
    _, sent = _run(
        monkeypatch,
        actions=[
            {"action": "mouse_move", "coordinate": [1, 2]},
            {"action": "scroll", "scroll_amount": 2, "scroll_direction": "down"},
            {"action": "zoom", "region": [0, 0, 10, 10]},
        ],
    )
    assert sent == [
        {"action": "mouse_move", "coordinate": [1, 2]},
        {"action": "scroll", "scroll_amount": 2, "scroll_direction": "down"},
        {"action": "zoom", "region": [0, 0, 10, 10]},
    ]


def test_missing_arguments_and_unknown_actions_are_the_models_to_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for call, said in (
        ({"action": "mouse_move"}, "coordinate must be provided"),
        ({"action": "left_click_drag", "coordinate": [1, 1]}, "start_coordinate must be"),
        ({"action": "key"}, "text must be provided"),
        ({"action": "zoom"}, "region must be provided"),
        ({"action": "key", "text": "a", "repeat": 500}, "between 1 and 100"),
        ({"actions": [{"action": "fly"}]}, "unknown action 'fly'"),
        ({}, "Either 'action' or 'actions'"),
    ):
        with pytest.raises(ToolParsingError, match=said):
            _run(monkeypatch, **call)
    for action in ("open_web_browser", "navigate"):
        with pytest.raises(ToolError, match="no web browser on this desktop"):
            _run(monkeypatch, action=action, text="https://example.com")


@pytest.mark.parametrize(
    "answer",
    [
        {"output": {"nested": 1}, "error": None, "base64_image": None},
        {"output": "", "error": ["x"], "base64_image": None},
        {"output": "", "error": "", "base64_image": 'x,"/><script>'},
        {"output": "", "error": "", "base64_image": "PHN2Zz48L3N2Zz4="},  # an SVG
        {"output": "", "error": "", "base64_image": "A" * (30 << 20)},
        {"output": "", "error": "", "base64_image": 7},
        ["not", "an", "object"],
    ],
    ids=["output-object", "error-list", "not-base64", "svg", "huge", "number", "list"],
)
def test_an_answer_of_another_shape_never_reaches_the_model(answer: Any) -> None:
    """Attacker walk: what the sandbox answers is checked as the browser's screenshots
    are (strict base64 of a PNG, bounded); a pydantic error or an SVG in the model's input
    before."""
    from sandbox_tools.errors import RuntimeTransportError

    with pytest.raises(RuntimeTransportError):
        _answer(answer)
