"""What an agent does on the desktop, as inspect's computer tool does it: input through
xdotool, then (for most actions) a screenshot once the screen had time to settle.

The actions, their arguments and their answers are inspect's (its tool-support's X11
client): `key` and `hold_key` take xdotool key names (the host normalises what models
write, "Enter" to "Return"), `type` types in groups of 50 characters 12 ms apart, a
click with `text` holds those keys down around it, `scroll` clicks buttons 4-7,
`double_click`/`triple_click` repeat 300 ms apart. The differences: xdotool is started
without a shell (its arguments are never parsed twice), a pointer already where it is
asked to go is not moved with `--sync` (xdotool then waits 15 s for a motion that never
comes), and the screenshot is the runtime's own (x11.py, png.py; the pointer drawn in)
at the display's size (1366 x 768, which inspect scales to nothing).

Standard library only, as the whole runtime.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

from sandbox_tools.runtime.tools.desktop.display import Desktop
from sandbox_tools.runtime.tools.desktop.png import draw_pointer, encode
from sandbox_tools.runtime.tools.desktop.tool_types import Click, ScrollDirection

TYPING_DELAY_MS = 12
TYPING_GROUP = 50
REPEAT_DELAY_MS = 300
XDOTOOL_TIMEOUT = 30.0
BUTTONS: dict[Click, list[str]] = {
    "left_click": ["1"],
    "right_click": ["3"],
    "middle_click": ["2"],
    "back_click": ["8"],
    "forward_click": ["9"],
    "double_click": ["--repeat", "2", "--delay", str(REPEAT_DELAY_MS), "1"],
    "triple_click": ["--repeat", "3", "--delay", str(REPEAT_DELAY_MS), "1"],
}
SCROLL_BUTTONS = {"up": "4", "down": "5", "left": "6", "right": "7"}


class ActionError(Exception):
    """The action cannot be done as asked; the message is for the model."""


@dataclass(frozen=True)
class Result:
    """What an action answers: xdotool's output and errors, and a PNG, as inspect's."""

    output: str = ""
    error: str = ""
    image: bytes | None = None

    def to_json(self) -> dict[str, str | None]:
        return {
            "output": self.output or None,
            "error": self.error or None,
            "base64_image": base64.b64encode(self.image).decode() if self.image else None,
        }


class Actions:
    """The actions on one running desktop. `settle` is how long a screen is given to
    redraw before the screenshot that follows an action (inspect's tool waits 2 s)."""

    def __init__(self, desktop: Desktop, settle: float) -> None:
        self.desktop = desktop
        self.settle = settle

    # -- what is on the screen -----------------------------------------------------------

    def screenshot_png(self, region: tuple[int, int, int, int] | None = None) -> bytes:
        """The screen (or the `region` x0, y0, x1, y1 of it) as PNG, the pointer drawn."""
        with self.desktop.connect() as display:
            x, y = display.pointer()
            rgb = bytearray(display.image())
            width, height = display.screen.width, display.screen.height
        draw_pointer(rgb, width, height, x, y)
        if region is None:
            return encode(bytes(rgb), width, height)
        x0, y0, x1, y1 = region
        if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
            raise ActionError(f"Invalid region: {list(region)} on a {width} x {height} screen")
        rows = (rgb[(row * width + x0) * 3 : (row * width + x1) * 3] for row in range(y0, y1))
        return encode(b"".join(rows), x1 - x0, y1 - y0)

    async def screenshot(self) -> Result:
        return Result(image=await asyncio.to_thread(self.screenshot_png))

    async def _settled(self, result: Result) -> Result:
        await asyncio.sleep(self.settle)
        shot = await self.screenshot()
        return Result(result.output, result.error, shot.image)

    def pointer(self) -> tuple[int, int]:
        with self.desktop.connect() as display:
            return display.pointer()

    # -- xdotool -------------------------------------------------------------------------

    async def _xdotool(self, *args: str) -> Result:
        process = await self.desktop.run(
            *self.desktop.programs.xdotool,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), XDOTOOL_TIMEOUT)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise ActionError(
                f"xdotool {args[0]} did not finish within {XDOTOOL_TIMEOUT:.0f} s"
            ) from None
        return Result(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def _check(self, coordinate: tuple[int, int]) -> tuple[str, str]:
        x, y = coordinate
        if not (0 <= x <= self.desktop.width and 0 <= y <= self.desktop.height):
            raise ActionError(f"Coordinates {x}, {y} are out of bounds")
        return str(x), str(y)

    async def _move(self, coordinate: tuple[int, int]) -> Result:
        x, y = self._check(coordinate)
        if await asyncio.to_thread(self.pointer) == coordinate:
            return Result()  # --sync would wait 15 s for a motion that never comes
        return await self._xdotool("mousemove", "--sync", x, y)

    async def _holding(self, text: str | None, *args: str) -> Result:
        """xdotool `args`, with the keys of `text` held down around them."""
        if not text:
            return await self._xdotool(*args)
        keys = text.split()
        await self._xdotool("keydown", "--", *keys)
        try:
            return await self._xdotool(*args)
        finally:
            await self._xdotool("keyup", "--", *keys)

    # -- the actions ---------------------------------------------------------------------

    async def key(self, text: str) -> Result:
        return await self._settled(await self._xdotool("key", "--", *text.split()))

    async def hold_key(self, text: str, duration: float) -> Result:
        keys = text.split()
        await self._xdotool("keydown", "--", *keys)
        await asyncio.sleep(duration)
        return await self._settled(await self._xdotool("keyup", "--", *keys))

    async def type(self, text: str) -> Result:
        results = [
            await self._xdotool(
                "type", "--delay", str(TYPING_DELAY_MS), "--", text[i : i + TYPING_GROUP]
            )
            for i in range(0, len(text), TYPING_GROUP)
        ]
        joined = Result("".join(r.output for r in results), "".join(r.error for r in results))
        return await self._settled(joined)

    async def cursor_position(self) -> Result:
        x, y = await asyncio.to_thread(self.pointer)
        return Result(output=f"X={x},Y={y}")

    async def mouse_move(self, coordinate: tuple[int, int]) -> Result:
        return await self._settled(await self._move(coordinate))

    async def left_mouse_down(self) -> Result:
        return await self._settled(await self._xdotool("mousedown", "1"))

    async def left_mouse_up(self) -> Result:
        return await self._settled(await self._xdotool("mouseup", "1"))

    async def click(
        self, action: Click, coordinate: tuple[int, int] | None, text: str | None
    ) -> Result:
        if coordinate is not None:
            await self._move(coordinate)
        return await self._settled(await self._holding(text, "click", *BUTTONS[action]))

    async def left_click_drag(
        self, start_coordinate: tuple[int, int], coordinate: tuple[int, int]
    ) -> Result:
        await self._move(start_coordinate)
        x, y = self._check(coordinate)
        dragged = await self._xdotool("mousedown", "1", "mousemove", "--sync", x, y, "mouseup", "1")
        return await self._settled(dragged)

    async def scroll(
        self,
        direction: ScrollDirection,
        amount: int,
        coordinate: tuple[int, int] | None,
        text: str | None,
    ) -> Result:
        if amount < 1:
            raise ActionError(f"scroll_amount must be at least 1, not {amount}")
        if coordinate is not None:
            await self._move(coordinate)
        clicks = ("click", "--repeat", str(amount), SCROLL_BUTTONS[direction])
        return await self._settled(await self._holding(text, *clicks))

    async def wait(self, duration: float) -> Result:
        await asyncio.sleep(duration)
        return await self.screenshot()

    async def zoom(self, region: tuple[int, int, int, int]) -> Result:
        return Result(image=await asyncio.to_thread(self.screenshot_png, region))
