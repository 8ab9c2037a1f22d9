"""One owner per server directory: two servers of one build never take one socket from
each other, and a server whose directory is gone, replaced or taken does not linger.

The runtime from source on this machine, each test in a directory of its own. Before,
a server whose directory was removed kept running; once the same path was made again
and a second server started there, the two replaced each other's socket every half
second, and calls landed on either (sessions and jobs "not found").
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import SRC, RuntimeDir, eventually

pytestmark = pytest.mark.timeout(120)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is gone for our purposes
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def started_server(directory: RuntimeDir) -> int:
    assert directory.result("runtime_info") is not None
    pid = directory.server_pid()
    assert pid is not None
    return pid


def kill(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_server_whose_directory_is_gone_exits(runtime_dir: RuntimeDir) -> None:
    first = started_server(runtime_dir)
    try:
        shutil.rmtree(runtime_dir.path)
        eventually(lambda: not alive(first), "the server to exit once its directory is gone")
    finally:
        kill(first)
        os.makedirs(runtime_dir.path, exist_ok=True)


def test_two_servers_of_one_build_never_take_one_socket_from_each_other(
    runtime_dir: RuntimeDir,
) -> None:
    """The leftover server's directory is removed and made again at once (a reinstall),
    and a second server starts there: the first steps down; the second keeps its socket
    and answers every call; its log never says it listened again."""
    first = started_server(runtime_dir)
    second = None
    try:
        saved = Path(runtime_dir.path + ".old")
        os.rename(runtime_dir.path, saved)  # gone from its path, still alive: the worst case
        os.mkdir(runtime_dir.path, 0o700)
        second = started_server(runtime_dir)
        assert second != first
        socket = Path(runtime_dir.path, "server.sock")
        inode = socket.lstat().st_ino
        eventually(lambda: not alive(first), "the leftover server to step down")
        for _ in range(6):  # three seconds: six of the old fight's rounds
            time.sleep(0.5)
            assert socket.lstat().st_ino == inode, "the socket was replaced"
            assert runtime_dir.server_pid() == second
        session = runtime_dir.result("bash_session_new_session")["session_name"]
        out = runtime_dir.result("bash_session", {"session_name": session, "input": "echo hi\n"})
        assert "hi" in out
        log = Path(runtime_dir.path, "server.log").read_text()
        assert "listening again" not in log
        old_log = (saved / "server.log").read_text()
        assert "listening again" not in old_log and "stepping down" in old_log
        shutil.rmtree(saved, ignore_errors=True)
    finally:
        kill(first)


def test_a_server_whose_lock_file_another_server_holds_steps_down(
    runtime_dir: RuntimeDir,
) -> None:
    """Its lock file replaced by one that a live server holds: that server owns the
    directory, and this one leaves without touching the owner's socket or pid file."""
    first = started_server(runtime_dir)
    lock = Path(runtime_dir.path, "server.lock")
    holder = None
    try:
        lock.unlink()
        # another process takes a new lock file at the path and keeps it
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys, time\n"
                f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": SRC},
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        socket = Path(runtime_dir.path, "server.sock")
        eventually(lambda: not alive(first), "the server to step down")
        assert "stepping down" in Path(runtime_dir.path, "server.log").read_text()
        assert socket.exists(), "a server that stepped down removed the owner's socket"
    finally:
        kill(first)
        if holder is not None:
            holder.kill()
            holder.wait()


def test_a_lock_file_removed_under_a_live_server_is_taken_again(
    runtime_dir: RuntimeDir,
) -> None:
    """A cleaner removes only the lock file: the server, still in its own directory,
    takes a new one, so a second server cannot start beside it."""
    first = started_server(runtime_dir)
    try:
        Path(runtime_dir.path, "server.lock").unlink()
        eventually(
            lambda: Path(runtime_dir.path, "server.lock").exists(), "the lock to be taken again"
        )
        time.sleep(1)
        assert alive(first)
        assert started_server(runtime_dir) == first
    finally:
        kill(first)


def test_the_default_server_directory_is_never_where_another_user_could_swap_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime from source keeps the launcher's rule: an image's TMPDIR that the
    agent owns is passed over for /tmp."""
    from sandbox_tools.runtime.paths import default_server_dir

    agents = tmp_path / "agents"
    agents.mkdir()
    os.chown(agents, 1000, 1000)
    monkeypatch.delenv("SANDBOX_TOOLS_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(agents))
    assert os.path.dirname(default_server_dir()) == "/tmp"
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    monkeypatch.setenv("TMPDIR", str(ours))
    assert os.path.dirname(default_server_dir()) == str(ours)
    link = tmp_path / "agents-link"  # the agent's link to root's directory: repointable
    link.symlink_to(ours)
    os.lchown(link, 1000, 1000)
    monkeypatch.setenv("TMPDIR", str(link))
    assert os.path.dirname(default_server_dir()) == "/tmp"


def test_a_browser_beside_the_executable_that_another_user_could_plant_is_not_run(
    tmp_path: Path,
) -> None:
    """A runtime copied to a directory others may write (/var/tmp-like, not sticky): a
    `browser/chrome` there is not the add-on, whoever made it, nor one owned by another
    user, nor one others may write; the add-on in a directory only root can change is."""
    from sandbox_tools.runtime.paths import BROWSER, installed_addon

    def planted(directory: Path, owner: int = 0, mode: int = 0o755) -> Path:
        (directory / "browser").mkdir(parents=True)
        chrome = directory / "browser" / "chrome"
        chrome.write_text("#!/bin/sh\nid > /tmp/pwned\n")
        chrome.chmod(mode)
        os.chown(chrome, owner, owner)
        return chrome

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    planted(open_dir)
    assert installed_addon(BROWSER, str(open_dir / "sandbox-tools")) is None
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    planted(theirs, owner=1000)
    assert installed_addon(BROWSER, str(theirs / "sandbox-tools")) is None
    writable = tmp_path / "writable"
    writable.mkdir()
    planted(writable, mode=0o777)
    assert installed_addon(BROWSER, str(writable / "sandbox-tools")) is None
    ours = tmp_path / "ours"
    ours.mkdir()
    chrome = planted(ours)
    assert installed_addon(BROWSER, str(ours / "sandbox-tools")) == str(chrome)
    # A runtime in a sticky shared directory (/tmp): the agent's `browser` link there,
    # flipped between a root-owned browser and its own, is never followed.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "browser").symlink_to(ours / "browser")
    os.lchown(sticky / "browser", 1000, 1000)
    assert installed_addon(BROWSER, str(sticky / "sandbox-tools")) is None
