"""The desktop tool: one X desktop per identity, started by its first action, stopped
with the server.

The desktop is the add-on's (`desktop` beside the runtime, or the tree the host mounted):
its X server with a fresh cookie, its window manager and a terminal, all run as the
identity the call acts as. A terminal on the desktop is a shell as that user, so root
only when a call asks for it by name (`user: "root"`): a call without `user` acts as the
server's own user, and a server running as root refuses it. The desktop's private files
(the authority with the cookie, the X server's log, the terminal's font cache) are in a
fresh directory of its own (0700, given to the identity), removed when it stops.

Standard library only, as the whole runtime.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from typing import Any

from sandbox_tools.protocol import DESKTOP_KEYMAPS_ENV, DESKTOP_PARENT_ENV
from sandbox_tools.runtime.addons import check_as_asked
from sandbox_tools.runtime.identity import Identity, resolve_user
from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.paths import (
    DESKTOP,
    installed_addon,
    private_directory,
    temporary_base,
)
from sandbox_tools.runtime.tools.desktop.actions import ActionError, Actions, Result
from sandbox_tools.runtime.tools.desktop.display import (
    Desktop,
    DesktopError,
    Programs,
    killed,
    start,
)
from sandbox_tools.runtime.tools.desktop.tool_types import (
    CLICKS,
    MAX_TEXT,
    ComputerParams,
    DesktopInfoParams,
)
from sandbox_tools.runtime.tools.desktop.x11 import X11Error

MAX_SETTLE_S = 60.0
TERMINAL_WAIT_S = 5.0
TERMINAL = ("-title", "Terminal", "-geometry", "100x30+40+40", "-fa", "monospace", "-fs", "11")


@dataclass
class _Running:
    desktop: Desktop
    actions: Actions
    terminal: asyncio.subprocess.Process | None


def _key(identity: Identity) -> tuple[int, int | None, tuple[int, ...]]:
    uid = os.geteuid() if identity.uid is None else identity.uid
    return uid, identity.gid, tuple(identity.groups or ())


class DesktopController:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._running: dict[tuple[int, int | None, tuple[int, ...]], _Running] = {}
        self._lock = asyncio.Lock()

    def entry(self) -> str | None:
        """The add-on's launcher the next desktop would start, if one is installed."""
        return installed_addon(DESKTOP, self.limits.launcher)

    def programs(self, entry: str, directory: str) -> Programs:
        return Programs(
            xvfb=(entry, "Xvfb"),
            xdotool=(entry, "xdotool"),
            window_manager=(entry, "twm"),
            environment={
                "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
                "LANG": "C.UTF-8",  # xdotool types beyond ASCII in a UTF-8 locale only
                "XDG_CACHE_HOME": os.path.join(directory, "cache"),
                DESKTOP_PARENT_ENV: str(os.getpid()),
                DESKTOP_KEYMAPS_ENV: directory,
                **({"SHELL": os.environ["SHELL"]} if "SHELL" in os.environ else {}),
            },
        )

    async def _desktop(self, params: ComputerParams) -> _Running:
        identity = resolve_user(params.user)
        key = _key(identity)
        if params.user is None and key[0] == 0:
            raise ToolError(
                "the desktop would run as root: a terminal on it is a root shell. Pass "
                "user= (a user of the image) to computer(), or user='root' to allow it"
            )
        async with self._lock:
            running = self._running.get(key)
            if running is not None and running.desktop.server.returncode is None:
                return running
            if running is not None:
                await self._stop(key)
            entry = self.entry()
            if entry is None:
                raise ToolError(
                    "the desktop add-on is not installed beside the runtime: the host's "
                    "computer() tool sends it with its first call"
                )
            base = temporary_base()
            if base is None:
                raise ToolError(
                    "no directory for the desktop's cookie that only root and the runtime's "
                    "user can change (tried $TMPDIR, /tmp, /var/tmp, /dev/shm)"
                )
            # Ours until its files are made (start() then gives it to the identity).
            directory = private_directory(base, "sandbox-tools-desktop-", None, None)
            try:
                desktop = await start(self.programs(entry, directory), directory, identity=identity)
            except (DesktopError, OSError) as exc:
                shutil.rmtree(directory, ignore_errors=True)
                raise ToolError(f"the desktop did not start: {exc}") from None
            running = _Running(
                desktop, Actions(desktop, _settle(self.limits.desktop_settle_s)), None
            )
            self._running[key] = running  # stopped with the others from here on
            running.terminal = await desktop.run(
                entry,
                "xterm",
                *TERMINAL,
                "-e",
                entry,
                "shell",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                cwd=identity.home if identity.home and os.path.isdir(identity.home) else "/",
            )
            await _shown(desktop, entry)
            return running

    async def action(self, params: ComputerParams) -> dict[str, Any]:
        running = await self._desktop(params)
        try:
            result = await _act(running.actions, params)
        except ActionError as exc:
            return Result(error=str(exc)).to_json()
        except X11Error as exc:
            raise ToolError(f"the desktop's display failed: {exc}") from None
        return result.to_json()

    async def info(self, params: DesktopInfoParams) -> dict[str, Any]:
        """Which launcher the next desktop would start, and with `addon_dir` and
        `addon_digest` the add-on there checked as `addon-check` checks it."""
        checked = await asyncio.to_thread(
            check_as_asked, params.addon_dir, params.addon_digest, params.addon_signature
        )
        return {"executable": self.entry(), **({"addon": checked} if checked else {})}

    async def _stop(self, key: tuple[int, int | None, tuple[int, ...]]) -> None:
        running = self._running.pop(key, None)
        if running is None:
            return
        if running.terminal is not None and running.terminal.returncode is None:
            await killed(running.terminal)
        await running.desktop.stop()
        shutil.rmtree(running.desktop.directory, ignore_errors=True)

    async def shutdown(self) -> None:
        for key in list(self._running):
            await self._stop(key)


async def _shown(desktop: Desktop, entry: str) -> None:
    """Wait (at most TERMINAL_WAIT_S) until the terminal's window is on the screen: the
    first screenshot shows the desktop the model was told of, not a black screen."""
    search = await desktop.run(
        entry,
        "xdotool",
        "search",
        "--sync",
        "--onlyvisible",
        "--class",
        "xterm",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.wait_for(search.wait(), TERMINAL_WAIT_S)
    except asyncio.TimeoutError:  # a terminal that does not start: the desktop goes on
        await killed(search)


def _settle(seconds: float) -> float:
    """The configured wait, within 0 to MAX_SETTLE_S ("inf" is a number, not a wait)."""
    return min(max(seconds, 0.0), MAX_SETTLE_S) if seconds == seconds else 0.0


def _need(value: Any, name: str, action: str) -> Any:
    if value is None:
        raise ActionError(f"{name} is required for action '{action}'")
    return value


async def _act(actions: Actions, params: ComputerParams) -> Result:
    """One action, as inspect's in-container tool does it."""
    action, text = params.action, params.text
    if text is not None and len(text) > MAX_TEXT:
        raise ActionError(f"text is {len(text)} characters; at most {MAX_TEXT} are typed")
    if action == "key":
        return await actions.key(_need(text, "text", action))
    if action == "hold_key":
        return await actions.hold_key(
            _need(text, "text", action), _need(params.duration, "duration", action)
        )
    if action == "type":
        return await actions.type(_need(text, "text", action))
    if action == "cursor_position":
        return await actions.cursor_position()
    if action == "mouse_move":
        return await actions.mouse_move(_need(params.coordinate, "coordinate", action))
    if action == "left_mouse_down":
        return await actions.left_mouse_down()
    if action == "left_mouse_up":
        return await actions.left_mouse_up()
    if action in CLICKS:
        return await actions.click(action, params.coordinate, text)
    if action == "left_click_drag":
        return await actions.left_click_drag(
            _need(params.start_coordinate, "start_coordinate", action),
            _need(params.coordinate, "coordinate", action),
        )
    if action == "scroll":
        return await actions.scroll(
            _need(params.scroll_direction, "scroll_direction", action),
            _need(params.scroll_amount, "scroll_amount", action),
            params.coordinate,
            text,
        )
    if action == "wait":
        return await actions.wait(_need(params.duration, "duration", action))
    if action == "screenshot":
        return await actions.screenshot()
    return await actions.zoom(_need(params.region, "region", action))
