"""inspect's `computer()` on our desktop, in real `inspect eval`s (mockllm plays the agent)
on `docker_sdk`: an image with no X server, no desktop and no python (Debian with only
x11-utils, for the small X program the agent operates), as uid 1000, with a read-only
root, an exec tmpfs and no network.

The agent takes a screenshot, types a command into the desktop's terminal (it starts
xmessage, a window with one button), clicks the button, then does every other action
once (and two at once, and a key three times); the scorer reads what xmessage printed
when its button was clicked. The screen's settle time is 0.3 s here
(SANDBOX_TOOLS_DESKTOP_SETTLE in the container's environment), not inspect's 2 s. The log holds
every result in inspect's shapes (text, an image, or both) and the transcript the
desktop add-on's install with its seconds.

The runtime and the add-on come from the checkout's dist/ (built on demand).
"""

from __future__ import annotations

import base64
import os
import struct
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from sandbox_tools.recipes import RootfsRecipe
from tests.support import run_inspect_eval

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")
pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.timeout(1800)]
HOST_ARCH = Arch.parse(os.uname().machine)

# xmessage's window where the agent expects it (twm keeps a program's own position), its
# one button made large, so the click lands on it whatever the fonts' metrics.
XMESSAGE = (
    "xmessage -geometry 400x200+500+300 -xrm '*Command.width: 360' "
    "-xrm '*Command.height: 120' -buttons Clicked:7 -print 'Click the button' "
    "> /tmp/clicked; echo exit=$? >> /tmp/clicked"
)
BUTTON = [700, 450]
TERMINAL = [200, 200]

TASK = textwrap.dedent(
    f"""
    from inspect_ai import Task, task
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import Score, Target, accuracy, scorer
    from inspect_ai.solver import TaskState
    from inspect_ai.util import sandbox

    from sandbox_tools.inspect import DockerSdkConfig, computer

    M = "mockllm/model"
    SETTLE = {{"SANDBOX_TOOLS_DESKTOP_SETTLE": "0.3"}}
    # Every other action once, on the terminal (harmless there), then two at once in
    # OpenAI's multi-action form and a key pressed three times.
    MORE = [
        {{"action": "mouse_move", "coordinate": [300, 300]}},
        {{"action": "left_mouse_down"}},
        {{"action": "left_mouse_up"}},
        {{"action": "left_click_drag", "start_coordinate": [100, 100], "coordinate": [300, 120]}},
        {{"action": "right_click", "coordinate": [300, 300]}},
        {{"action": "middle_click"}},
        {{"action": "back_click"}},
        {{"action": "forward_click"}},
        {{"action": "double_click", "coordinate": [120, 75]}},
        {{"action": "triple_click"}},
        {{"action": "scroll", "scroll_amount": 3, "scroll_direction": "up",
          "coordinate": [300, 300]}},
        {{"action": "hold_key", "text": "shift", "duration": 1}},
        {{"actions": [{{"action": "mouse_move", "coordinate": [10, 10]}},
                      {{"action": "cursor_position"}}]}},
        {{"action": "key", "text": "ctrl+ENTER", "repeat": 3}},
    ]
    SCRIPT = [
        ModelOutput.for_tool_call(M, "computer", {{"action": "screenshot"}}),
        ModelOutput.for_tool_call(
            M,
            "computer",
            {{"action": "type", "text": {XMESSAGE!r}, "coordinate": {TERMINAL},
              "press_enter": True}},
        ),
        ModelOutput.for_tool_call(M, "computer", {{"action": "wait", "duration": 1}}),
        ModelOutput.for_tool_call(
            M, "computer", {{"action": "left_click", "coordinate": {BUTTON}}}
        ),
        ModelOutput.for_tool_call(M, "computer", {{"action": "cursor_position"}}),
        ModelOutput.for_tool_call(
            M, "computer", {{"action": "key", "text": "ctrl+l"}}
        ),
        ModelOutput.for_tool_call(
            M, "computer", {{"action": "zoom", "region": [0, 0, 683, 384]}}
        ),
        *(ModelOutput.for_tool_call(M, "computer", arguments) for arguments in MORE),
        ModelOutput.for_tool_call(M, "submit", {{"answer": "clicked"}}),
    ]
    for output in SCRIPT:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


    @scorer(metrics=[accuracy()])
    def button_clicked():
        async def score(state: TaskState, target: Target) -> Score:
            printed = await sandbox().exec(["cat", "/tmp/clicked"])
            return Score(
                value="C" if printed.stdout == "Clicked\\nexit=7\\n" else "I",
                explanation=printed.stdout + printed.stderr,
            )

        return score


    @task
    def desktop(image: str):
        return Task(
            dataset=[Sample(input="Click the button.", target="clicked")],
            solver=react(tools=[computer()]),
            scorer=button_clicked(),
            model=get_model(M, custom_outputs=SCRIPT),
            sandbox=("docker_sdk", DockerSdkConfig(image=image, user="1000:1000",
                                                   read_only=True, tmpfs={{"/tmp": "exec"}},
                                                   network_mode="none",
                                                   environment=SETTLE)),
        )
    """
)


@pytest.fixture(scope="module")
def x11_utils_image(docker_engine: Any) -> str:
    from sandbox_tools.sandboxes.images import ensure_image

    recipe = RootfsRecipe(suite="bookworm", arch=HOST_ARCH, include=("x11-utils",))
    return ensure_image(docker_engine, recipe)


def _tool_results(sample: dict[str, Any]) -> list[Any]:
    return [message["content"] for message in sample["messages"] if message["role"] == "tool"]


def _png(sample: dict[str, Any], item: dict[str, Any]) -> bytes:
    image = str(item["image"])
    image = sample["attachments"].get(image.removeprefix("attachment://"), image)
    prefix = "data:image/png;base64,"
    assert image.startswith(prefix), image[:60]
    return base64.b64decode(image.removeprefix(prefix))


def _size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def _rows(png: bytes) -> list[bytes]:
    """The RGB rows of one of the runtime's PNGs (8-bit RGB, unfiltered rows)."""
    width, height = _size(png)
    position, idat = 8, b""
    while position < len(png):
        (length,) = struct.unpack_from(">I", png, position)
        if png[position + 4 : position + 8] == b"IDAT":
            idat += png[position + 8 : position + 8 + length]
        position += 12 + length
    raw = zlib.decompress(idat)
    stride = width * 3 + 1
    return [raw[r * stride + 1 : (r + 1) * stride] for r in range(height)]


def test_the_agent_clicks_a_button_of_the_images_program_on_our_desktop(
    x11_utils_image: str, tmp_path: Path
) -> None:
    (tmp_path / "task.py").write_text(TASK)
    sample, _log = run_inspect_eval(
        tmp_path / "task.py", "-T", f"image={x11_utils_image}", env={}, timeout=1200
    )
    score = next(iter(sample["scores"].values()))
    assert score["value"] == "C", score
    results = _tool_results(sample)
    shot, typed, waited, clicked, position, keyed, zoomed = results[:7]
    more = results[7:]  # (react's submit ends the run, with no tool message)
    assert len(more) == 14, results
    for result in (*more[:12], more[13]):  # each answered with a screenshot, no error
        assert isinstance(result, list) and result[-1]["type"] == "image", result
    assert more[12] == "X=10,Y=10"  # the last of its actions answers
    for result in (shot, typed, waited, clicked, keyed):
        assert isinstance(result, list) and [i["type"] for i in result] == ["image"], result
        assert _size(_png(sample, result[0])) == (1366, 768)
    assert position == f"X={BUTTON[0]},Y={BUTTON[1]}"
    assert _size(_png(sample, zoomed[0])) == (683, 384)
    # Before the click xmessage's window was on the screen; after it, gone.
    before, after = _rows(_png(sample, waited[0])), _rows(_png(sample, clicked[0]))
    window = slice(3 * 520, 3 * 880)
    assert before[350][window] != after[350][window]
    (install,) = [
        event["data"]
        for event in sample["events"]
        if event.get("event") == "info" and "desktop_addon" in event.get("data", {})
    ]
    assert install["desktop_addon"].startswith("sandbox-tools-desktop-")
    assert install["sent_bytes"] > 0 and install["transfer"] == "tar", install
