"""Attacks on the desktop from inside the sandbox, each found by a fresh-context attacker
walk and each a test now (THREAT_MODEL.md, "The desktop"):

- the desktop's own user swaps its private directory in /tmp for a link to /etc while
  the root runtime makes the cookie's file and the X server's log in it: nothing may
  appear in /etc (the files are made through the directory's descriptor);
- another uid takes every `/tmp/server-<n>.xkm` first (the X server's compiled keymap,
  which its compiler makes exclusively): the desktop still starts (the keymap is kept in
  the desktop's private directory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.injector.addon_delivery import ensure_addon
from sandbox_tools.injector.inject import forget_sandbox, tool_support_sandbox
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import RunningContainer
from tests.support import locked_down_busybox

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]
HOST_ARCH = Arch.parse(os.uname().machine)
AGENT = "1000:1000"
RACER = Path(__file__).parent / "desktop_attacks" / "racer.c"
KILL_X_SERVERS = (
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '[b]in/Xvfb' "
    "&& kill -9 ${p#/proc/}; done; true"
)


@pytest.fixture(scope="module")
def racer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("musl-gcc") is None:
        pytest.skip("needs musl-gcc (musl-tools) to build the racer")
    out = tmp_path_factory.mktemp("racer") / "racer"
    subprocess.run(["musl-gcc", "-static", "-O2", "-o", str(out), str(RACER)], check=True)
    return out


async def test_a_directory_swapped_for_a_link_never_leads_roots_files_elsewhere(
    docker_engine: Any, python_image: str, racer: Path
) -> None:
    """The agent (uid 1000, the desktop's user) races every new desktop directory with
    a link to /etc, and kills its own X server after each call so that the next one
    starts a desktop again: 15 rounds, and neither the cookie's file nor the log ever
    appears in /etc (the attacker's walk won on its second round before the fix)."""
    with RunningContainer(
        docker_engine, python_image, network_mode="none", tmpfs={"/tmp": "exec"}
    ) as container:
        sandbox = container.sandbox
        await sandbox.write_file("/opt/racer", racer.read_bytes())
        await sandbox.exec(["chmod", "755", "/opt/racer"])
        support = await tool_support_sandbox(sandbox)
        await ensure_addon(support, ArtifactKind.DESKTOP)
        raced = await sandbox.exec(
            ["sh", "-c", "(/opt/racer /etc > /tmp/raced 2>&1 &); sleep 0.3"], user=AGENT
        )
        assert raced.returncode == 0, raced.stderr
        for _ in range(15):
            try:
                await support.client.call(
                    "computer_action", {"action": "cursor_position", "user": AGENT}
                )
            except Exception:  # a desktop whose directory was swapped is refused: fine
                pass
            await sandbox.exec(["sh", "-c", KILL_X_SERVERS], user=AGENT)
        planted = await sandbox.exec(["sh", "-c", "ls /etc/authority /etc/xvfb.log 2>&1"])
        assert b"No such file" in planted.stdout and b"/etc/authority\n" not in planted.stdout
        rounds = await sandbox.exec(["cat", "/tmp/raced"])
        assert rounds.stdout.count(b"raced sandbox-tools-desktop-") >= 10, rounds.stdout
        await forget_sandbox(sandbox)


async def test_keymap_names_taken_by_another_uid_do_not_stop_the_desktop(
    docker_engine: Any,
) -> None:
    with locked_down_busybox(docker_engine, HOST_ARCH, user=None) as container:
        sandbox = container.sandbox
        taken = await sandbox.exec(
            ["sh", "-c", "for i in $(seq 0 63); do mkdir /tmp/server-$i.xkm; done"],
            user="1001:1001",
        )
        assert taken.returncode == 0, taken.stderr
        support = await tool_support_sandbox(sandbox)
        await ensure_addon(support, ArtifactKind.DESKTOP)
        shot = await support.client.call(
            "computer_action", {"action": "key", "text": "a", "user": AGENT}
        )
        assert not shot["error"] and shot["base64_image"], shot
        await forget_sandbox(sandbox)
