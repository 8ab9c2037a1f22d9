"""text_editor against hostile files: no request wedges the server or loses user data.

THREAT_MODEL.md, rule 4 ("a failed write leaves the old file intact; undo never silently
discards someone else's change") and rule 5 ("no file operation blocks on a FIFO ...").
A real runtime server from source, driven through the persistent channel.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_tools.errors import ToolError
from sandbox_tools.injector.jsonrpc_client import RuntimeClient
from sandbox_tools.injector.tool_clients import text_editor
from tests.support import RuntimeDir, peak_rss_mib

pytestmark = pytest.mark.security


async def test_undo_onto_a_fifo_fails_at_once_and_wedges_nothing(
    client: RuntimeClient, tmp_path: Path
) -> None:
    """Rule 5: ten undos onto files swapped for FIFOs (once six blocked every executor
    thread and then every later file operation, and stop-server could not stop it)."""
    for index in range(10):
        path = tmp_path / f"f{index}"
        await text_editor(client, "create", str(path), file_text="one\n")
        await text_editor(client, "str_replace", str(path), old_str="one", new_str="two")
        path.unlink()
        os.mkfifo(path)
        started = time.monotonic()
        with pytest.raises(ToolError, match="not a regular file"):
            await text_editor(client, "undo_edit", str(path))
        assert time.monotonic() - started < 5
        with pytest.raises(ToolError, match="not a regular file"):
            await text_editor(client, "view", str(path))
    # Every later operation still works.
    other = tmp_path / "after"
    await text_editor(client, "create", str(other), file_text="fine\n")
    assert "fine" in await text_editor(client, "view", str(other))


async def test_undo_refuses_to_discard_a_change_made_since_the_edit(
    client: RuntimeClient, tmp_path: Path
) -> None:
    """Rule 4: undo never silently discards someone else's change."""
    path = tmp_path / "shared.txt"
    await text_editor(client, "create", str(path), file_text="a\nb\n")
    await text_editor(client, "str_replace", str(path), old_str="b", new_str="B")
    path.write_text("a\nB\nadded by a command\n")
    with pytest.raises(ToolError, match="has changed since the last edit"):
        await text_editor(client, "undo_edit", str(path))
    assert path.read_text() == "a\nB\nadded by a command\n"
    # The same for undoing a create: a file changed since is not removed.
    created = tmp_path / "created.txt"
    await text_editor(client, "create", str(created), file_text="x\n")
    created.write_text("y\n")
    with pytest.raises(ToolError, match="has changed"):
        await text_editor(client, "undo_edit", str(created))
    assert created.read_text() == "y\n"


async def test_edits_keep_mode_and_follow_symlinks(client: RuntimeClient, tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_text("echo one\n")
    path.chmod(0o750)
    link = tmp_path / "link.sh"
    link.symlink_to(path)
    await text_editor(client, "str_replace", str(link), old_str="one", new_str="two")
    assert link.is_symlink() and path.read_text() == "echo two\n"
    assert path.stat().st_mode & 0o777 == 0o750
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sandbox-tools-edit")]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs"
)
async def test_a_full_disk_leaves_the_original_intact(
    client: RuntimeClient, tmp_path: Path
) -> None:
    """Rule 4: writes go to a temporary file and are renamed into place; a failure part-way
    (here: no space) used to truncate the file first and lose it."""
    small = tmp_path / "small"
    small.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)]
    await asyncio.to_thread(subprocess.run, mount, check=True)
    try:
        path = small / "notes.txt"
        original = "".join(f"line {n:05}\n" for n in range(4000))  # 44 KB of 64 KB
        path.write_text(original)
        with pytest.raises(ToolError, match="no space left"):
            await text_editor(
                client, "str_replace", str(path), old_str="line 00000", new_str="LINE 0"
            )
        assert path.read_text() == original
        assert [p.name for p in small.iterdir()] == ["notes.txt"]  # no partial file
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", str(small)], check=True)


async def test_huge_views_are_capped_and_do_not_balloon_the_server(
    client: RuntimeClient, runtime_dir: RuntimeDir, tmp_path: Path
) -> None:
    """Rule 5: a file of 12 million empty lines once took the server to gigabytes and
    froze every tool; files over the cap are refused with a remedy."""
    many = tmp_path / "many-lines"
    many.write_bytes(b"\n" * 12_000_000)
    started = time.monotonic()
    view = await text_editor(client, "view", str(many), view_range=(5_000_000, -1))
    assert "5000000\t" in view and "truncated" in view
    insert = await text_editor(client, "insert", str(many), insert_line=6_000_000, new_str="X")
    assert "6000001\tX" in insert
    assert time.monotonic() - started < 30
    pid = runtime_dir.server_pid()
    assert pid is not None
    peak_mib = peak_rss_mib(pid)
    assert peak_mib < 400, f"server peaked at {peak_mib:.0f} MiB"
    huge = tmp_path / "huge"
    with huge.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024)
    with pytest.raises(ToolError, match="more than text_editor handles"):
        await text_editor(client, "view", str(huge))
    assert "fine" not in await asyncio.wait_for(
        text_editor(client, "view", str(tmp_path)), 30
    )  # the server still answers


async def test_a_hostile_agent_does_not_starve_another_client(
    client: RuntimeClient, runtime_dir: RuntimeDir, tmp_path: Path
) -> None:
    """Rule 5: while one client undoes onto FIFOs, views a file of 12 million lines and
    runs flooding jobs nobody polls, another client's `version` stays fast. Bound stated
    here: p99 under 250 ms on a loaded 2-core VM (it is a few ms when idle)."""
    from sandbox_tools.injector.exec_remote import start_exec_remote

    many = tmp_path / "many-lines"
    many.write_bytes(b"\n" * 12_000_000)
    fifos = []
    for index in range(10):
        path = tmp_path / f"f{index}"
        await text_editor(client, "create", str(path), file_text="one\n")
        await text_editor(client, "str_replace", str(path), old_str="one", new_str="two")
        path.unlink()
        os.mkfifo(path)
        fifos.append(path)

    async def hostile() -> None:
        jobs = [await start_exec_remote(client, "yes flood") for _ in range(10)]
        for _ in range(3):
            for path in fifos:
                with pytest.raises(ToolError):
                    await text_editor(client, "undo_edit", str(path))
            await text_editor(client, "view", str(many), view_range=(6_000_000, -1))
        for job in jobs:
            await job.kill()

    async def measure() -> list[float]:
        reader, writer = await asyncio.open_unix_connection(
            os.path.join(runtime_dir.path, "server.sock")
        )
        latencies = []
        for index in range(200):
            started = time.perf_counter()
            writer.write(b'{"jsonrpc":"2.0","id":%d,"method":"version"}\n' % index)
            await writer.drain()
            assert b'"result"' in await asyncio.wait_for(reader.readline(), 30)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
        writer.close()
        return latencies

    _, latencies = await asyncio.gather(hostile(), measure())
    p99 = sorted(latencies)[int(len(latencies) * 0.99) - 1]
    print(f"version p99 next to a hostile agent: {p99 * 1000:.1f} ms")
    assert p99 < 0.25, f"p99 {p99 * 1000:.0f} ms"


@pytest.mark.security
@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root runtime and another user")
async def test_acting_for_the_agent_means_passing_its_user(
    client: RuntimeClient, tmp_path: Path
) -> None:
    """THREAT_MODEL.md "Design choices": a root runtime without `user=` acts as root and
    follows the links that are there; with the agent's user, the kernel refuses what the
    agent could not do itself. (Our inspect tools always pass the sandbox's user.)"""
    secret = tmp_path / "shadow"
    secret.write_text("root:secret\n")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    planted = tmp_path / "planted"  # what an agent at uid 65534 leaves in /tmp
    planted.symlink_to(secret)
    assert "root:secret" in await text_editor(client, "view", str(planted))
    with pytest.raises(ToolError, match=r"(?i)permission denied"):
        await text_editor(client, "view", str(planted), user="65534:65534")
    with pytest.raises(ToolError, match=r"(?i)permission denied"):
        await text_editor(client, "create", str(tmp_path / "job"), file_text="x", user="65534")
