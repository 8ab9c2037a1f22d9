"""The locked wheelhouse installed offline by a real pip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandbox_tools.build_containers import lock
from sandbox_tools.platforms import Arch


def test_wheelhouse_installs_offline_with_hashes(tmp_path: Path) -> None:
    """Download the lock for this machine, then resolve it with no index at all."""
    arch = Arch.parse(__import__("os").uname().machine)
    wheelhouse = lock.ensure_wheelhouse(arch, lock.FREEZE_LOCK, tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            "--require-hashes",
            "-r",
            str(lock.FREEZE_LOCK),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"},
    )
    assert result.returncode == 0, result.stderr
    assert "pyinstaller-6.22.3" in result.stdout.replace("_", "-").lower()
