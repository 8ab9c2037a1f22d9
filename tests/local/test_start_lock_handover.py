"""The bridge's side of the launcher's early server start, with a real server.

The launcher starts the server and hands the `stdio` bridge the start lock it holds; the
bridge waits for that server instead of starting one and then releases the lock. A
descriptor that is not this directory's start lock is neither used nor closed.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_tools.protocol import START_LOCK_FD_ENV
from sandbox_tools.runtime import client
from sandbox_tools.runtime.paths import ServerPaths, server_paths


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[ServerPaths]:
    found = server_paths(str(tmp_path / "run"))
    yield found
    client.connect(found, start=False).close()  # it is up; ask it to go
    subprocess.run(
        [sys.executable, "-m", "sandbox_tools.runtime", "stop-server"],
        env={**os.environ, "SANDBOX_TOOLS_DIR": found.directory},
        check=True,
        timeout=30,
    )


def _start_server(paths: ServerPaths) -> None:
    subprocess.Popen(
        [sys.executable, "-m", "sandbox_tools.runtime", "server", "--dir", paths.directory],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_the_bridge_waits_for_the_launchers_server_and_releases_the_lock(
    paths: ServerPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = os.open(paths.start_lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _start_server(paths)  # what the launcher does before it runs the bridge
    monkeypatch.setenv(START_LOCK_FD_ENV, str(lock))
    started: list[object] = []
    # The client imports subprocess only to start a server: the module's Popen is the one.
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))

    sock = client.connect(paths)
    sock.close()

    assert started == []  # no second server
    assert START_LOCK_FD_ENV not in os.environ  # used once
    with pytest.raises(OSError):
        os.fstat(lock)  # released: closed
    other = os.open(paths.start_lock, os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free for the next client
    os.close(other)


def test_a_descriptor_that_is_not_the_start_lock_is_left_alone(
    paths: ServerPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unrelated = os.open(tmp_path / "unrelated", os.O_RDWR | os.O_CREAT, 0o600)
    monkeypatch.setenv(START_LOCK_FD_ENV, str(unrelated))

    client.connect(paths).close()  # starts the server the ordinary way

    os.fstat(unrelated)  # still open: not ours to close
    os.close(unrelated)
