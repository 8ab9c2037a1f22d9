"""The desktop add-on, built for real: its static checks, and a desktop on it where
nothing helps it: busybox without libc as uid 1000 with no network and a read-only root,
an image with no shell at all, and a Debian image without any X package driven by the
runtime's own desktop code.

The add-on is built by the `tools build` code (`built_addon`, tests/conftest.py); a second
session reuses it from the cache by build id. Defects are made for real: the built tree
repacked without a file it needs.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.build_containers.tree_archive import read_archive
from sandbox_tools.distro_matrix.static import addon_static_checks, static_checks
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.tools.desktop.display import authority_entry
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.images import ensure_busybox_image
from tests.support import (
    arches_under_test,
    locked_down_busybox,
    recorded_as_built,
    repacked_without,
    runtime_source,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]
HOST_ARCH = Arch.parse(os.uname().machine)
DESKTOP = ArtifactKind.DESKTOP


@pytest.mark.parametrize("arch", arches_under_test(), ids=lambda a: a.value)
def test_the_built_add_on_passes_its_static_checks(built_addon: Any, arch: Arch) -> None:
    record, path = built_addon(DESKTOP, arch)
    assert record.kind is DESKTOP and record.name.endswith(f"-linux-{arch.value}.tar.xz")
    assert record.tool_versions["xvfb"].startswith("2:21.1")
    assert static_checks(path, record) == []


def test_a_tree_without_the_keymap_shim_or_a_library_fails_naming_it(
    built_addon: Any, tmp_path: Path
) -> None:
    record, path = built_addon(DESKTOP, HOST_ARCH)
    for leave_out, said in (
        ("lib/xkbcomp-shim.so", "no lib/xkbcomp-shim.so (Xvfb's keymap without a shell)"),
        ("lib/libxdo.so.3", "bin/xdotool needs libxdo.so.3, which the tree lacks"),
    ):
        broken = repacked_without(path, tmp_path / record.name, leave_out)
        assert said in addon_static_checks(broken, recorded_as_built(record, broken))


def _plain_tree(path: Path, under: str) -> bytes:
    """The add-on's tree as a plain tar under `under`, for the engine's archive API."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member, content in read_archive(str(path)):
            member.name = f"{under}/{member.name}"
            tar.addfile(member, io.BytesIO(content) if member.isfile() else None)
    return out.getvalue()


# As the runtime will start it: a fresh cookie in an authority file only we can read, a
# display the server picks itself, the sockets' directory made first (a non-root X
# server makes none), the window manager, a terminal whose shell is the image's.
DESKTOP_UP = """
set -e
D=/tmp/desktop/desktop
export LANG=C.UTF-8 XDG_CACHE_HOME=/tmp/x/cache XAUTHORITY=/tmp/x/auth SHELL=/bin/sh
mkdir -p -m 1777 /tmp/.X11-unix
$D Xvfb -displayfd 3 -auth /tmp/x/auth -nolisten tcp -noreset -extension GLX \
  -screen 0 1366x768x24 3>/tmp/x/display >/tmp/x/xvfb.log 2>&1 &
for i in $(seq 100); do [ -s /tmp/x/display ] && break; sleep 0.05; done
export DISPLAY=:$(cat /tmp/x/display)
$D twm >/dev/null 2>&1 &
$D xterm -fa monospace -fs 11 -e $D shell >/tmp/x/xterm.log 2>&1 &
$D xdotool search --sync --onlyvisible --class xterm >/dev/null
$D xdotool type --delay 12 'echo "héllo, desktop" > /tmp/x/typed'
$D xdotool key Return
for i in $(seq 100); do [ -s /tmp/x/typed ] && break; sleep 0.05; done
cat /tmp/x/typed
echo "display $DISPLAY"
"""


async def test_the_desktop_types_into_its_terminal_in_busybox_without_libc(
    docker_engine: Any, built_addon: Any
) -> None:
    """Streamed into a container with only a static busybox and unpacked there; as uid
    1000, no network, a read-only root: Xvfb with a cookie, twm, xterm running the
    image's shell, text beyond ASCII typed by xdotool reaches that shell. Another uid,
    without the cookie, is refused by the display."""
    _, path = built_addon(DESKTOP, HOST_ARCH)
    with locked_down_busybox(docker_engine, HOST_ARCH) as container:
        sandbox = container.sandbox
        unpacked = await sandbox.exec(
            ["sh", "-c", "mkdir -p /tmp/desktop /tmp/x && xz -d | tar -x -C /tmp/desktop"],
            input=path.read_bytes(),
            timeout=300,
        )
        assert unpacked.returncode == 0, unpacked.stderr.decode(errors="replace")
        entry = authority_entry(secrets.token_bytes(16))
        wrote = await sandbox.exec(["sh", "-c", "umask 077 && cat > /tmp/x/auth"], input=entry)
        assert wrote.returncode == 0, wrote.stderr
        up = await sandbox.exec(["sh", "-c", DESKTOP_UP], timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        typed, display = up.stdout.decode().splitlines()
        assert typed == "héllo, desktop"
        # Another uid of the sandbox: its own authority file is not the cookie's.
        intruder = await sandbox.exec(
            ["/tmp/desktop/desktop", "xdotool", "getmouselocation"],
            env={"DISPLAY": display.split()[1], "XAUTHORITY": "/tmp/none"},
            user="1001",
        )
        assert intruder.returncode != 0
        assert b"Can't open display" in intruder.stderr, intruder.stderr


async def test_the_x_server_compiles_its_keymap_where_the_image_has_no_shell(
    docker_engine: Any, built_addon: Any
) -> None:
    """No /bin/sh in the image: the X server's one shell command (its keymap compiler)
    runs through the tree's shim, so keys typed reach the server's keymap."""
    _, path = built_addon(DESKTOP, HOST_ARCH)
    image = ensure_busybox_image(docker_engine, HOST_ARCH, applets=False)
    busybox = "/.sleeper/busybox"
    with RunningContainer(
        docker_engine,
        image,
        command=[busybox, "sleep", "infinity"],
        network_mode="none",
        user="1000:1000",
        tmpfs={"/tmp": "exec"},
    ) as container:
        container.container.put_archive("/", _plain_tree(path, "opt/desktop"))
        sandbox = container.sandbox
        assert (await sandbox.exec(["/bin/sh", "-c", "true"])).returncode != 0  # no shell
        started = await sandbox.exec(
            [
                busybox,
                "sh",
                "-c",
                "/opt/desktop/desktop Xvfb :4 -nolisten tcp >/tmp/xvfb.log 2>&1 & "
                f"for i in $({busybox} seq 100); do "
                f"[ -e /tmp/.X11-unix/X4 ] && exit 0; {busybox} sleep 0.05; done; exit 1",
            ],
            env={"PATH": "/nowhere"},
        )
        assert started.returncode == 0, started.stdout + started.stderr
        keyed = await sandbox.exec(
            ["/opt/desktop/desktop", "xdotool", "key", "a", "getmouselocation"],
            env={"DISPLAY": ":4"},
        )
        log = (await sandbox.exec([busybox, "cat", "/tmp/xvfb.log"])).stdout.decode(
            errors="replace"
        )
        assert keyed.returncode == 0, keyed.stderr.decode(errors="replace") + log
        assert b"x:" in keyed.stdout
        assert "xkbcomp" not in log and "keymap" not in log.lower(), log


RUNTIME_DESKTOP = """
import asyncio, json, os, sys
sys.path.insert(0, "/opt/src")
from sandbox_tools.runtime.tools.desktop.actions import Actions
from sandbox_tools.runtime.tools.desktop.display import Programs, start

TREE = "/opt/desktop/desktop"

async def main():
    programs = Programs(
        (TREE, "Xvfb"), (TREE, "xdotool"), (TREE, "twm"),
        environment={"LANG": "C.UTF-8", "XDG_CACHE_HOME": "/tmp/desk/cache", "SHELL": "/bin/sh"},
    )
    desktop = await start(programs, "/tmp/desk")
    actions = Actions(desktop, settle=0.2)
    await asyncio.create_subprocess_exec(
        TREE, "xterm", "-geometry", "60x8+0+0", "-fa", "monospace", "-e", TREE, "shell",
        env=desktop.program_environment(),
    )
    found = await asyncio.create_subprocess_exec(
        TREE, "xdotool", "search", "--sync", "--onlyvisible", "--class", "xterm",
        env=desktop.program_environment(), stdout=asyncio.subprocess.DEVNULL,
    )
    await found.wait()
    await actions.click("left_click", (100, 60), None)
    typed = await actions.type("echo $((6 * 7)) über > /tmp/desk/typed")
    await actions.key("Return")
    for _ in range(100):
        if os.path.exists("/tmp/desk/typed"):
            break
        await asyncio.sleep(0.05)
    shot = actions.screenshot_png()
    answers = {
        "typed": open("/tmp/desk/typed").read(),
        "typed_error": typed.error,
        "position": (await actions.cursor_position()).output,
        "png": shot[:8].hex(),
        "size": [int.from_bytes(shot[i:i + 4], "big") for i in (16, 20)],
        "display": desktop.display,
    }
    await desktop.stop()
    print(json.dumps(answers))

asyncio.run(main())
"""


async def test_the_runtimes_desktop_runs_on_the_add_on_in_an_image_without_x(
    docker_engine: Any, built_addon: Any, python_image: str
) -> None:
    """Debian with python3 and no X package: the runtime's desktop code starts the tree's
    X server and window manager, clicks into the tree's terminal and types a command its
    shell runs, and takes a screenshot of the display's size."""
    _, path = built_addon(DESKTOP, HOST_ARCH)
    with RunningContainer(docker_engine, python_image, network_mode="none") as container:
        container.container.put_archive("/", _plain_tree(path, "opt/desktop"))
        container.container.put_archive("/opt", runtime_source())
        sandbox = container.sandbox
        await sandbox.write_file("/opt/run.py", RUNTIME_DESKTOP.encode())
        done = await sandbox.exec(["python3", "/opt/run.py"], user="1000", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        answers = json.loads(done.stdout.decode().splitlines()[-1])
    assert answers["typed"] == "42 über\n"
    assert answers["typed_error"] == ""
    assert answers["position"] == "X=100,Y=60"
    assert answers["png"] == "89504e470d0a1a0a" and answers["size"] == [1366, 768]
