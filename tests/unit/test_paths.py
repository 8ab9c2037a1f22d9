from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox_tools.runtime.paths import ServerDirError, server_paths


def test_creates_private_directory(tmp_path: Path) -> None:
    paths = server_paths(str(tmp_path / "a" / "srv"))
    assert stat.S_IMODE(os.stat(paths.directory).st_mode) == 0o700


def test_tightens_loose_permissions_of_our_own_directory(tmp_path: Path) -> None:
    target = tmp_path / "srv"
    target.mkdir(mode=0o777)
    os.chmod(target, 0o777)
    server_paths(str(target))
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o700


def test_refuses_directory_owned_by_someone_else(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a directory owned by another user")
    target = tmp_path / "srv"
    target.mkdir()
    os.chown(target, 1000, 1000)
    with pytest.raises(ServerDirError, match="owned by uid 1000"):
        server_paths(str(target))


def test_refuses_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ServerDirError, match="symlink"):
        server_paths(str(tmp_path / "link"))


def test_refuses_paths_too_long_for_a_socket(tmp_path: Path) -> None:
    with pytest.raises(ServerDirError, match="too long"):
        server_paths(str(tmp_path / ("x" * 120)), create=False)
