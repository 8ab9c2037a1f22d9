"""A desktop for the model, in the sample's sandbox: inspect's `computer()` tool on our
runtime and its desktop add-on, in any image.

inspect's own tool needs an image made for it (an X server, a desktop, python3 and its
tool script). Ours has the same name and exactly inspect's parameters, so a provider that
substitutes its native computer use for inspect's tool (`is_computer_tool_info`) does so
for ours; the same actions and answers (a text, a screenshot, or both), the same key-name
normalisation, `max_screenshots`, and calls never run in parallel. The desktop is the
runtime's: the first call of a sample sends the desktop add-on (about 7 MB) into the
sandbox, or reuses a checked copy, and the runtime starts an X server with a cookie, a
window manager and a terminal, as the sandbox's default user (never root unless
`user="root"` says so). The programs the agent operates are the image's own, started
from that terminal (or anywhere with its DISPLAY and XAUTHORITY).

`open_web_browser` and `navigate` need a web browser that draws windows, which the
add-on does not carry: they answer an error that says so (a browser of the image's can
be started from the terminal; `web_browser()` is the headless one).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from inspect_ai._util.content import Content
from inspect_ai.tool import ContentImage, ContentText, Tool, ToolError, ToolResult, tool
from inspect_ai.tool._tool import TOOL_INIT_MODEL_INPUT, ToolParsingError
from inspect_ai.tool._tool_call import ToolCallModelInputHints

from sandbox_tools import errors
from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.errors import RuntimeTransportError
from sandbox_tools.injector.addon_delivery import AddonInstall, ensure_addon
from sandbox_tools.injector.jsonrpc_client import MAX_MESSAGE_CHARS, bounded_text, checked_png
from sandbox_tools.injector.log_bounds import said
from sandbox_tools.inspect.tools import _Bound, _bound_for, _for_model, report_addon, want_addon
from sandbox_tools.runtime.jsonrpc import InvalidParams
from sandbox_tools.runtime.tools.desktop.tool_types import (
    COMPUTER_ACTIONS,
    ComputerAction,
    ComputerParams,
    ScrollDirection,
)

# The runtime's actions, and the two that need a web browser that draws windows.
Action = Literal[ComputerAction, "open_web_browser", "navigate"]
MAX_REPEAT = 100  # presses of one `key` action, each a round trip
# What the other actions pass on as the model gave it: the runtime's params but the
# action, the text (`key`, `hold_key` and `type` above handle it) and who acts.
_PASSED = tuple(
    f.name for f in dataclasses.fields(ComputerParams) if f.name not in ("action", "text", "user")
)
MAX_OUTPUT_CHARS = 100_000  # xdotool's output in one answer, as the model reads it
NO_BROWSER = (
    "There is no web browser on this desktop: open_web_browser and navigate need one that "
    "draws windows. Start a browser the sandbox has from the terminal, if it has one."
)
REMOVED_SCREENSHOT = (
    "Screenshot removed to reduce size of input. Please consult the latest screenshots "
    "for the most up to date state of the screen."
)

# -- key names as models write them -> xdotool's --------------------------------------------

# xdotool's keysym names are case-sensitive ("Return"); models write them in any case.
_KEYSYMS = (
    *("Return", "Escape", "BackSpace", "Tab", "Delete", "Insert", "Home", "End", "Pause"),
    *("Prior", "Next", "Left", "Up", "Right", "Down", "space"),
    *("Scroll_Lock", "Num_Lock", "Caps_Lock", "Shift_L", "Shift_R", "Control_L", "Control_R"),
    *("Alt_L", "Alt_R", "Super_L", "Super_R", "Meta_L", "Meta_R"),
)
_KEYPAD = (
    *("0", "1", "2", "3", "4", "5", "6", "7", "8", "9"),
    *("Enter", "Add", "Subtract", "Multiply", "Divide", "Decimal", "Equal", "Begin"),
    *("Home", "Up", "Prior", "Left", "Right", "End", "Down", "Next", "Insert", "Delete"),
)
_KEY_NAMES = {
    name.lower(): name
    for name in (*_KEYSYMS, *(f"F{n}" for n in range(1, 13)), *(f"KP_{k}" for k in _KEYPAD))
}
# Names models use that xdotool does not know, and the modifiers' other spellings.
_KEY_NAMES.update(
    enter="Return",
    esc="Escape",
    pageup="Prior",
    pagedown="Next",
    arrowleft="Left",
    arrowup="Up",
    arrowright="Right",
    arrowdown="Down",
    printscreen="Print",
    prtscr="Print",
    ctl="ctrl",
    control="ctrl",
    cmd="super",
    command="super",
    win="super",
    windows="super",
    opt="alt",
    option="alt",
)
_KEY_NAMES[","] = "comma"


def xdotool_keys(text: str) -> str:
    """`text`'s key combinations (space-separated, `+` within one) in xdotool's names: a
    single letter keeps its case alone and is lower case in a combination (shift says
    otherwise), other names are looked up without case; unknown ones pass as written."""

    def combo(keys: str) -> str:
        parts = keys.split("+")
        return "+".join(
            (part.lower() if len(parts) > 1 else part)
            if len(part) == 1 and part.isalpha()
            else _KEY_NAMES.get(part.lower(), part)
            for part in parts
        )

    return " ".join(combo(keys) for keys in text.split())


# -- the tool ---------------------------------------------------------------------------------


def _repeat(value: object) -> int:
    """A `key` action's `repeat`: 1 to MAX_REPEAT, given as a model may (an integral
    number or its text); checked before any key is pressed."""
    count: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    elif isinstance(value, str):
        try:
            count = int(value)
        except ValueError:
            count = None
    if count is None:
        raise ToolParsingError(f"repeat must be an integer (got {value!r})")
    if not 1 <= count <= MAX_REPEAT:
        raise ToolParsingError(f"repeat must be between 1 and {MAX_REPEAT} (got {count})")
    return count


def _required(args: dict[str, Any], name: str) -> Any:
    value = args.get(name)
    if value is None:
        raise ToolParsingError(f"{name} must be provided")
    return value


def _answer(result: Any) -> ToolResult:
    """The runtime's {output, error, base64_image} as inspect's tool answers the model;
    an answer of another shape, or an image that is no PNG, is RuntimeTransportError
    (the sandbox's answer, never passed on as it is)."""
    if not isinstance(result, dict) or not all(
        isinstance(result.get(field), (str, type(None))) for field in ("output", "error")
    ):
        raise RuntimeTransportError(f"computer_action answered {said(result)}")
    if result.get("error"):
        raise ToolError(bounded_text(result["error"], MAX_MESSAGE_CHARS, "error"))
    text = (
        bounded_text(result["output"], MAX_OUTPUT_CHARS, "output") if result.get("output") else None
    )
    encoded = result.get("base64_image")
    if encoded is not None:
        checked_png(encoded, "computer_action")
    image = ContentImage(image=f"data:image/png;base64,{encoded}") if encoded else None
    if text is not None and image is not None:
        return [ContentText(text=text), image]
    if text is not None:
        return str(text)
    if image is not None:
        return [image]
    return "OK"


def _model_input(max_screenshots: int) -> Any:
    """Only the last `max_screenshots` results keep their screenshots when played back
    to the model; older ones say they were removed (as inspect's tool does)."""

    def model_input(
        index: int, total: int, content: str | list[Content], hints: ToolCallModelInputHints
    ) -> str | list[Content]:
        if (
            hints.get("disable_computer_screenshot_truncation", False)
            or isinstance(content, str)
            or total - index <= max_screenshots
        ):
            return content
        return [
            ContentText(text=REMOVED_SCREENSHOT) if isinstance(c, ContentImage) else c
            for c in content
        ]

    return model_input


class _Desktop:
    """The desktop of one tool: its sandbox, its user and its deadline per action."""

    def __init__(self, user: str | None, sandbox: str | None, timeout: int | None) -> None:
        self.user = user
        self.sandbox = sandbox
        self.timeout = float(timeout) if timeout is not None else None

    async def _installed(self, bound: _Bound) -> AddonInstall:
        support = bound.ready()
        first = ArtifactKind.DESKTOP not in support.addons
        try:
            install = await ensure_addon(support, ArtifactKind.DESKTOP)
        except errors.SandboxToolsError as exc:
            raise RuntimeError(
                f"sandbox-tools could not install the desktop in {support.sandbox.name}: "
                f"{exc.explained()}"
            ) from None
        if first:
            report_addon(support, "desktop_addon", install)
        return install

    async def act(self, args: dict[str, Any]) -> ToolResult:
        """One primitive action, as the runtime's `computer_action` takes it."""
        bound = await _bound_for(self.sandbox)
        user = self.user or bound.default_user
        if user is None and bound.ready().recon.uid == 0:
            raise RuntimeError(
                "computer(): the sandbox's default user is root, and a desktop's terminal is "
                "a shell as its user; pass computer(user=...) a user of the image, or "
                'computer(user="root") to run the desktop as root'
            )
        try:
            params = ComputerParams.parse(args).to_params(user)
        except InvalidParams as exc:
            raise ToolParsingError(str(exc)) from None
        await self._installed(bound)
        try:
            result = await bound.ready().client.call(
                "computer_action", params, timeout=self.timeout or 24 * 3600.0
            )
        except errors.ToolError as exc:
            raise _for_model(exc) from None
        return _answer(result)

    async def run(self, args: dict[str, Any]) -> ToolResult:
        """One of the model's actions: a `key` pressed `repeat` times, a `type` clicked
        into first and followed by Return as asked, the others as they are."""
        action = str(args.get("action", ""))
        coordinate = args.get("coordinate")
        if action in ("open_web_browser", "navigate"):
            raise ToolError(NO_BROWSER)
        if action not in COMPUTER_ACTIONS:
            raise ToolParsingError(f"unknown action {action!r}")
        if action == "key":
            keys = xdotool_keys(_required(args, "text"))
            result: ToolResult = "OK"
            for _ in range(_repeat(args.get("repeat", 1) or 1)):
                result = await self.act({"action": "key", "text": keys})
            return result
        if action == "hold_key":
            text = xdotool_keys(_required(args, "text"))
            duration = _required(args, "duration")
            return await self.act({"action": action, "text": text, "duration": duration})
        if action == "type":
            if coordinate is not None:
                await self.act({"action": "left_click", "coordinate": coordinate})
            result = await self.act({"action": "type", "text": _required(args, "text")})
            if args.get("press_enter"):
                result = await self.act({"action": "key", "text": "Return"})
            return result
        for name in {
            "mouse_move": ("coordinate",),
            "left_click_drag": ("start_coordinate", "coordinate"),
            "scroll": ("scroll_amount", "scroll_direction"),
            "wait": ("duration",),
            "zoom": ("region",),
        }.get(action, ()):
            _required(args, name)
        return await self.act(
            {"action": action, **{k: args[k] for k in _PASSED if args.get(k) is not None}}
        )


@tool(name="computer", parallel=False)
def computer(
    max_screenshots: int | None = 1,
    timeout: int | None = 180,
    user: str | None = None,
    sandbox: str | None = None,
) -> Tool:
    """A desktop in the sandbox for the model: inspect's computer tool on our runtime.

    Args:
      max_screenshots: How many of the latest screenshots are played back to the model
        (None: all); older ones are replaced by a note.
      timeout: Seconds each action may take (None: no limit).
      user: Run the desktop as this user (default: the sandbox's default user; a desktop
        as root only with "root", since its terminal is a root shell).
      sandbox: The sample's sandbox to use (default: the default one).
    """
    want_addon(ArtifactKind.DESKTOP)
    desktop = _Desktop(user, sandbox, timeout)

    async def execute(
        action: Action | None = None,
        coordinate: list[int] | None = None,
        duration: int | None = None,
        region: list[int] | None = None,
        scroll_amount: int | None = None,
        scroll_direction: ScrollDirection | None = None,
        start_coordinate: list[int] | None = None,
        text: str | None = None,
        repeat: int | None = None,
        press_enter: bool | None = None,
        actions: list[dict[str, object]] | None = None,
    ) -> ToolResult:
        """
        Use a mouse and keyboard on the computer's desktop: a 1366 x 768 screen with a terminal.

        Icons open with a double click; buttons and menu items with a single click. Most
        actions answer with a screenshot of the screen after them.

        Args:
          action (Action): What to do.
              - `key`: press a key or key combination, in xdotool's names, e.g.
                "Return", "ctrl+s", "alt+Tab", "BackSpace", "Escape", "F5", "KP_0".
              - `hold_key`: hold a key or combination down for `duration` seconds.
              - `type`: type `text` (clicking at `coordinate` first when given).
              - `cursor_position`: the pointer's (x, y) position.
              - `mouse_move`: move the pointer to `coordinate`.
              - `left_mouse_down`, `left_mouse_up`: press or release the left button.
              - `left_click`, `right_click`, `middle_click`, `back_click`,
                `forward_click`, `double_click`, `triple_click`: click at
                `coordinate`, or where the pointer is.
              - `left_click_drag`: drag from `start_coordinate` to `coordinate`.
              - `scroll`: scroll `scroll_amount` clicks in `scroll_direction` (at
                `coordinate` when given).
              - `wait`: wait `duration` seconds, then take a screenshot.
              - `screenshot`: take a screenshot.
              - `zoom`: a screenshot of `region` [x0, y0, x1, y1] at the screen's resolution.
              - `open_web_browser`, `navigate`: open a web browser, or go to the URL
                in `text` (only where the desktop has a browser).
          coordinate (list[int] | None): An (x, y) pixel position on the screen.
          duration (int | None): Seconds, for `hold_key` and `wait`.
          region (list[int] | None): [x0, y0, x1, y1], for `zoom`.
          scroll_amount (int | None): Clicks of the wheel, for `scroll`.
          scroll_direction (Literal["up", "down", "left", "right"] | None): For `scroll`.
          start_coordinate (list[int] | None): Where a `left_click_drag` starts.
          text (str | None): The keys for `key` and `hold_key`, the text for `type`.
          repeat (int | None): How many times `key` presses its keys (1 to 100; default 1).
          press_enter (bool | None): Press Return after `type`.
          actions (list[dict] | None): Several actions done in order, each a dict of the
            arguments above.

        Returns:
          What the action printed, and a screenshot for most actions.
        """
        if actions is not None:
            steps = actions
        elif action is not None:
            given = {
                "action": action,
                "coordinate": coordinate,
                "duration": duration,
                "region": region,
                "scroll_amount": scroll_amount,
                "scroll_direction": scroll_direction,
                "start_coordinate": start_coordinate,
                "text": text,
                "repeat": repeat,
                "press_enter": press_enter,
            }
            steps = [{k: v for k, v in given.items() if v is not None}]
        else:
            raise ToolParsingError("Either 'action' or 'actions' must be provided")
        result: ToolResult = "OK"
        for step in steps:
            result = await desktop.run(dict(step))
        return result

    if max_screenshots is not None:
        setattr(execute, TOOL_INIT_MODEL_INPUT, _model_input(max_screenshots))
    return execute
