"""The desktop's screenshots, taken by the runtime's own X11 client (runtime/tools/
desktop): against a real Xvfb with a cookie, in a container without network, as uid
1000. The pixels must be what the X server was told to draw, the pointer where xdotool
put it, and a client without the cookie refused."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.images import ensure_image
from tests.support import arches_under_test, runtime_source

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

SRC = Path(__file__).resolve().parents[2] / "src"
DESKTOP = SRC / "sandbox_tools" / "runtime" / "tools" / "desktop"
COOKIE = "0123456789abcdef0123456789abcdef"
X = "DISPLAY=:5 XAUTHORITY=/tmp/x/auth"
SHOT = """
import sys
sys.path.insert(0, "/opt/desktop")
from x11 import Display, X11Error
from png import draw_pointer, encode
cookie = bytes.fromhex(sys.argv[1])
try:
    with Display(5, cookie) as display:
        x, y = display.pointer()
        rgb = bytearray(display.image())
        screen = display.screen
except X11Error as exc:
    print("refused:", exc)
    raise SystemExit(3)
draw_pointer(rgb, screen.width, screen.height, x, y)
open("/tmp/x/shot.png", "wb").write(encode(bytes(rgb), screen.width, screen.height))
print(x, y, screen.width, screen.height)
"""


@pytest.fixture(scope="module")
def x_image(docker_engine: Any) -> str:
    include = (
        "python3",
        "xvfb",
        "xauth",
        "xdotool",
        "x11-xserver-utils",
        "pngcheck",
        "twm",
        "xterm",
    )
    recipe = RootfsRecipe(suite="bookworm", arch=arches_under_test()[0], include=include)
    return ensure_image(docker_engine, recipe)


def decode(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and packed RGB of an 8-bit RGB PNG whose rows are unfiltered."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, idat, size = 8, b"", (0, 0)
    while position < len(png):
        (length,) = struct.unpack_from(">I", png, position)
        kind = png[position + 4 : position + 8]
        data = png[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", data[:8])
            assert data[8:10] == b"\x08\x02"
        elif kind == b"IDAT":
            idat += data
        position += 12 + length
    width, height = size
    raw = zlib.decompress(idat)
    rows = [raw[r * (width * 3 + 1) : (r + 1) * (width * 3 + 1)] for r in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, b"".join(row[1:] for row in rows)


def pixel(rgb: bytes, width: int, x: int, y: int) -> bytes:
    return rgb[(y * width + x) * 3 : (y * width + x) * 3 + 3]


async def test_a_screenshot_is_what_the_display_shows_with_the_pointer_where_it_is(
    docker_engine: Any, x_image: str
) -> None:
    with RunningContainer(docker_engine, x_image) as container:
        sandbox = container.sandbox
        for name in ("__init__.py", "x11.py", "png.py"):
            await sandbox.write_file(f"/opt/desktop/{name}", (DESKTOP / name).read_bytes())
        await sandbox.write_file("/opt/shot.py", SHOT.encode())
        made = await sandbox.exec(["sh", "-c", "mkdir -p /tmp/x && chown 1000 /tmp/x"])
        assert made.returncode == 0, made.stderr
        started = await sandbox.exec(["sh", "-c", START], user="1000")
        assert started.returncode == 0, started.stdout + started.stderr
        drawn = await sandbox.exec(
            ["sh", "-c", f"{X} xsetroot -solid '#102030' && {X} xdotool mousemove 100 200"],
            user="1000",
        )
        assert drawn.returncode == 0, drawn.stderr
        shot = await sandbox.exec(["python3", "/opt/shot.py", COOKIE], user="1000")
        assert shot.returncode == 0, shot.stdout + shot.stderr
        assert shot.stdout.decode().split() == ["100", "200", "1366", "768"]
        checked = await sandbox.exec(["pngcheck", "/tmp/x/shot.png"])
        assert checked.returncode == 0, checked.stdout
        width, height, rgb = decode(await sandbox.read_file("/tmp/x/shot.png"))
        assert (width, height) == (1366, 768)
        assert pixel(rgb, width, 10, 10) == bytes.fromhex("102030")
        assert pixel(rgb, width, 1365, 767) == bytes.fromhex("102030")
        assert pixel(rgb, width, 100, 200) == b"\0\0\0"  # the arrow's tip
        assert pixel(rgb, width, 102, 206) == b"\xff\xff\xff"  # its fill

        # Without the display's cookie, as the agent in another uid would be: refused.
        other = "0" * 32
        refused = await sandbox.exec(["python3", "/opt/shot.py", other], user="1001")
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "the display refused the connection" in refused.stdout.decode()


START = (
    f"xauth -f /tmp/x/auth add :5 MIT-MAGIC-COOKIE-1 {COOKIE} && "
    "(Xvfb :5 -screen 0 1366x768x24 -auth /tmp/x/auth -nolisten tcp -noreset -extension GLX "
    ">/tmp/x/log 2>&1 &) && "
    "for i in $(seq 100); do [ -S /tmp/.X11-unix/X5 ] && exit 0; sleep 0.05; done; "
    "cat /tmp/x/log; exit 1"
)


LIFECYCLE = """
import asyncio, json, os, sys
sys.path.insert(0, "/opt/src")
from sandbox_tools.runtime.tools.desktop.display import DesktopError, Programs, start

async def main():
    try:
        programs = Programs(("/usr/bin/Xvfb",), ("/usr/bin/xdotool",), ("/usr/bin/twm",))
        desktop = await start(programs, "/tmp/desk-" + sys.argv[1])
    except DesktopError as exc:
        print(json.dumps({"refused": str(exc)}))
        return
    env = {**os.environ, **desktop.environment()}
    moved = await asyncio.create_subprocess_exec("xdotool", "mousemove", "40", "50", env=env)
    await moved.wait()
    with desktop.connect() as display:
        pointer = display.pointer()
    socket_owner = os.lstat(f"/tmp/.X11-unix/X{desktop.display}").st_uid
    mode = os.stat(desktop.directory).st_mode & 0o777
    if sys.argv[2] == "stop":
        await desktop.stop()
    print(json.dumps({
        "display": desktop.display, "pointer": pointer, "socket_owner": socket_owner,
        "mode": oct(mode), "cookie": desktop.cookie.hex(), "server": desktop.server.pid,
        "wm": desktop.window_manager.pid, "authority": os.path.exists(desktop.authority),
    }))

asyncio.run(main())
"""


async def _run_lifecycle(sandbox: Any, user: str, name: str, stop: bool = True) -> dict[str, Any]:
    done = await sandbox.exec(
        ["python3", "/opt/lifecycle.py", name, "stop" if stop else "keep"], user=user, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return answer


async def test_the_runtime_starts_its_own_desktop_with_a_cookie_and_stops_it(
    docker_engine: Any, x_image: str
) -> None:
    """As uid 1000: the X server picks a display nobody holds (uid 1001 serves :0
    first), its socket is ours, our client and xdotool reach it with the cookie, another
    uid does not; stopped, nothing of it runs and the authority is gone."""
    with RunningContainer(docker_engine, x_image) as container:
        sandbox = container.sandbox
        container.container.put_archive("/opt", runtime_source())
        await sandbox.write_file("/opt/lifecycle.py", LIFECYCLE.encode())
        await sandbox.write_file(
            "/opt/shot.py",
            SHOT.replace("Display(5, cookie)", "Display(int(sys.argv[2]), cookie)").encode(),
        )
        for name in ("__init__.py", "x11.py", "png.py"):
            await sandbox.write_file(f"/opt/desktop/{name}", (DESKTOP / name).read_bytes())
        # The image has the sockets' directory (root's, sticky: x11-common makes it so).
        # The agent (uid 1001) runs an X server of its own on :0 first, open to anyone
        # (-ac): a desktop that took it would draw where the agent watches.
        made = await sandbox.exec(["sh", "-c", "mkdir -m 1777 /tmp/.X11-unix"])
        assert made.returncode == 0, made.stderr
        agent = await sandbox.exec(
            [
                "sh",
                "-c",
                "(Xvfb :0 -ac -nolisten tcp -noreset >/dev/null 2>&1 &) && for i in $(seq 100);"
                " do [ -S /tmp/.X11-unix/X0 ] && exit 0; sleep 0.05; done; exit 1",
            ],
            user="1001",
        )
        assert agent.returncode == 0, agent.stderr
        kept = await _run_lifecycle(sandbox, "1000", "a", stop=False)
        assert kept["display"] != 0, kept
        assert kept["socket_owner"] == 1000 and kept["mode"] == "0o700"
        assert kept["pointer"] == [40, 50] and kept["authority"]
        # Another uid, without the cookie: refused; with it (were it to leak): let in.
        shot = ["python3", "/opt/shot.py", "0" * 32, str(kept["display"])]
        refused = await sandbox.exec(shot, user="1001")
        assert refused.returncode == 3 and b"refused the connection" in refused.stdout
        stopped = await _run_lifecycle(sandbox, "1000", "b")
        assert stopped["display"] != kept["display"] and stopped["pointer"] == [40, 50]
        left = await sandbox.exec(
            [
                "sh",
                "-c",
                f"kill -0 {stopped['server']} {stopped['wm']} 2>/dev/null; echo $?; ls /tmp/desk-b",
            ]
        )
        assert left.stdout.decode().split()[0] == "1", left.stdout  # neither runs
        assert b"authority" not in left.stdout


async def test_a_socket_directory_another_uid_could_change_is_refused(
    docker_engine: Any, x_image: str
) -> None:
    """The agent made /tmp/.X11-unix its own (its own X server does so where the image
    has none): it could swap the display's socket for its own and get our cookie. No
    desktop, and a reason; sticky or not, the directory's owner may replace entries."""
    with RunningContainer(docker_engine, x_image) as container:
        sandbox = container.sandbox
        container.container.put_archive("/opt", runtime_source())
        await sandbox.write_file("/opt/lifecycle.py", LIFECYCLE.encode())
        made = await sandbox.exec(["sh", "-c", "mkdir -m 1777 /tmp/.X11-unix"], user="1001")
        assert made.returncode == 0, made.stderr
        done = await sandbox.exec(["python3", "/opt/lifecycle.py", "c", "stop"], user="1000")
        answer = json.loads(done.stdout.decode().splitlines()[-1])
        assert "another user could replace the display's socket" in answer["refused"], answer
        assert "uid 1001's" in answer["refused"]


ACTIONS = """
import asyncio, json, os, sys, time
sys.path.insert(0, "/opt/src")
from sandbox_tools.runtime.tools.desktop.actions import ActionError, Actions
from sandbox_tools.runtime.tools.desktop.display import Programs, start

async def main():
    programs = Programs(
        ("/usr/bin/Xvfb",), ("/usr/bin/xdotool",), ("/usr/bin/twm", "-f", "/opt/twmrc")
    )
    desktop = await start(programs, "/tmp/desk")
    actions = Actions(desktop, settle=0.2)
    env = {**os.environ, **desktop.environment()}
    shell = "read line; echo \\"$line\\" > /tmp/typed"
    await asyncio.create_subprocess_exec(
        "xterm", "-geometry", "60x8+0+0", "-e", "sh", "-c", shell, env=env
    )
    found = await asyncio.create_subprocess_exec(
        "xdotool", "search", "--sync", "--onlyvisible", "--class", "xterm", env=env,
        stdout=asyncio.subprocess.DEVNULL,
    )
    await found.wait()
    answers = {}
    moved = await actions.mouse_move((100, 50))
    answers["moved_image"] = moved.image[:8].hex() if moved.image else None
    begun = time.monotonic()
    await actions.mouse_move((100, 50))  # already there: no 15 s wait
    answers["again_seconds"] = time.monotonic() - begun
    answers["position"] = (await actions.cursor_position()).output
    typed = await actions.type("hello desktop")
    await actions.key("Return")
    for _ in range(50):
        if os.path.exists("/tmp/typed"):
            break
        await asyncio.sleep(0.1)
    answers["typed"] = open("/tmp/typed").read()
    answers["typed_result"] = sorted(typed.to_json())
    zoomed = await actions.zoom((0, 0, 200, 100))
    answers["zoom_size"] = list(int.from_bytes(zoomed.image[i:i + 4], "big") for i in (16, 20))
    await actions.left_click_drag((10, 10), (300, 300))
    answers["dragged_to"] = (await actions.cursor_position()).output
    scrolled = await actions.scroll("down", 3, (120, 60), "shift")
    answers["scrolled"] = (scrolled.error, scrolled.image is not None)
    clicked = await actions.click("double_click", (130, 70), None)
    answers["clicked"] = (await actions.cursor_position()).output
    for bad in ((2000, 10), (-1, 5)):
        try:
            await actions.mouse_move(bad)
        except ActionError as exc:
            answers.setdefault("refused", []).append(str(exc))
    try:
        await actions.zoom((10, 10, 5, 5))
    except ActionError as exc:
        answers["bad_zoom"] = str(exc)
    await desktop.stop()
    print(json.dumps(answers))

asyncio.run(main())
"""

TWMRC = """RandomPlacement
UsePPosition "on"
NoTitle
"""


async def test_the_actions_type_click_move_drag_scroll_and_zoom_as_inspects_do(
    docker_engine: Any, x_image: str
) -> None:
    """inspect's actions through xdotool on the runtime's own desktop, as uid 1000: text
    typed into a terminal reaches its shell, the pointer goes where it is sent (at
    once when it is there already), a zoom is the region at the screen's resolution."""
    with RunningContainer(docker_engine, x_image) as container:
        sandbox = container.sandbox
        container.container.put_archive("/opt", runtime_source())
        await sandbox.write_file("/opt/actions.py", ACTIONS.encode())
        await sandbox.write_file("/opt/twmrc", TWMRC.encode())
        done = await sandbox.exec(["python3", "/opt/actions.py"], user="1000", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        answers = json.loads(done.stdout.decode().splitlines()[-1])
        assert answers["moved_image"] == "89504e470d0a1a0a"  # a PNG follows the action
        assert answers["again_seconds"] < 5
        assert answers["position"] == "X=100,Y=50"
        assert answers["typed"] == "hello desktop\n"
        assert answers["typed_result"] == ["base64_image", "error", "output"]
        assert answers["zoom_size"] == [200, 100]
        assert answers["dragged_to"] == "X=300,Y=300"
        assert answers["scrolled"] == ["", True]
        assert answers["clicked"] == "X=130,Y=70"
        assert answers["refused"] == [
            "Coordinates 2000, 10 are out of bounds",
            "Coordinates -1, 5 are out of bounds",
        ]
        assert answers["bad_zoom"].startswith("Invalid region: [10, 10, 5, 5]")
