"""The runtime's desktop (`computer_action`, `computer_info`) on the desktop add-on,
through the host's own delivery, in busybox without libc (read-only root, exec tmpfs, no
network), with the runtime injected as root:

- never root unless asked; one desktop per identity, each on a display of its own that
  the other uid cannot reach without the cookie;
- state across runs: a server killed without its shutdown takes its X servers with it
  (and their window managers and terminals end), the next call's server starts a fresh
  desktop, and a server's shutdown stops every desktop it started.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from typing import Any

import pytest

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.errors import ToolError
from sandbox_tools.injector.addon_delivery import ensure_addon
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.platforms import Arch
from tests.support import locked_down_busybox

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]
HOST_ARCH = Arch.parse(os.uname().machine)
AGENT, OTHER = "1000:1000", "1001:1001"


async def _desktop_processes(sandbox: Any) -> list[tuple[str, str]]:
    """(user, program) of every desktop process in the container."""
    listed = await sandbox.exec(["ps", "-o", "user,args"])
    found = []
    for line in listed.stdout.decode().splitlines()[1:]:
        user, _, args = line.strip().partition(" ")
        for program in ("bin/Xvfb", "bin/twm", "bin/xterm"):
            if program in args:
                found.append((user, program.removeprefix("bin/")))
    return sorted(found)


async def _gone(sandbox: Any) -> list[tuple[str, str]]:
    for _ in range(50):
        left = await _desktop_processes(sandbox)
        if not left:
            return left
        await asyncio.sleep(0.1)
    return left


def _png_size(encoded: str) -> tuple[int, int]:
    png = base64.b64decode(encoded)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


async def test_one_desktop_per_identity_never_root_and_none_left_by_a_killed_server(
    docker_engine: Any,
) -> None:
    with locked_down_busybox(docker_engine, HOST_ARCH, user=None) as container:
        sandbox = container.sandbox
        support = await tool_support_sandbox(sandbox)
        installed = await ensure_addon(support, ArtifactKind.DESKTOP)
        call = support.client.call
        info = await call("computer_info", {})
        assert info["executable"] == installed.executable

        with pytest.raises(ToolError, match="the desktop would run as root"):
            await call("computer_action", {"action": "screenshot"})
        assert await _desktop_processes(sandbox) == []

        # docs/INJECTION.md's lines, as written there:
        user = "1000:1000"  # the desktop's user: its terminal is a shell as this user
        shot = await support.client.call("computer_action", {"action": "screenshot", "user": user})
        png_base64 = shot["base64_image"]  # 1366 x 768, the pointer drawn in
        typed = await support.client.call(
            "computer_action", {"action": "type", "text": "ls", "user": user}
        )
        assert shot["error"] in ("", None) and _png_size(png_base64) == (1366, 768)
        assert typed["base64_image"] and user == AGENT
        moved = await call(
            "computer_action", {"action": "mouse_move", "coordinate": [10, 20], "user": AGENT}
        )
        assert moved["base64_image"]
        other = await call("computer_action", {"action": "cursor_position", "user": OTHER})
        assert other["output"] == "X=683,Y=384"  # its own screen: the pointer where it began
        mine = await call("computer_action", {"action": "cursor_position", "user": AGENT})
        assert mine["output"] == "X=10,Y=20"
        off = await call(
            "computer_action", {"action": "mouse_move", "coordinate": [5000, 1], "user": AGENT}
        )
        assert off["error"] == "Coordinates 5000, 1 are out of bounds"
        running = await _desktop_processes(sandbox)  # busybox names uid 1000 "user"
        assert running == sorted(
            (user, program) for user in ("user", "1001") for program in ("Xvfb", "twm", "xterm")
        )

        # uid 1001 at uid 1000's display, without its cookie: refused.
        sockets = await sandbox.exec(["sh", "-c", "ls -ln /tmp/.X11-unix"])
        owners = {
            fields[-1]: fields[2]
            for fields in (line.split() for line in sockets.stdout.decode().splitlines()[1:])
        }
        (agents,) = [name for name, uid in owners.items() if uid == "1000"]  # ls -n: numbers
        intruder = await sandbox.exec(
            [installed.executable, "xdotool", "getmouselocation"],
            env={"DISPLAY": f":{agents.removeprefix('X')}"},
            user=OTHER,
        )
        assert intruder.returncode != 0 and b"Can't open display" in intruder.stderr

        # The server killed without its shutdown: its X servers end with it, the rest
        # with their displays.
        runtime = await call("runtime_info", {})
        killed = await sandbox.exec(["kill", "-9", str(runtime["pid"])])
        assert killed.returncode == 0, killed.stderr
        assert await _gone(sandbox) == []

        # The next call's server starts a fresh desktop; its shutdown stops it.
        again = await call("computer_action", {"action": "cursor_position", "user": AGENT})
        assert again["output"] == "X=683,Y=384"
        assert [p for _, p in await _desktop_processes(sandbox)] == ["Xvfb", "twm", "xterm"]
        await call("sandbox_tools_shutdown", {})
        assert await _gone(sandbox) == []
        left = await sandbox.exec(["sh", "-c", "ls -d /tmp/sandbox-tools-desktop-* | wc -l"])
        # Only the killed server's two (its cookies of displays that are gone).
        assert left.stdout.decode().strip() == "2"
        await forget_sandbox(sandbox)
