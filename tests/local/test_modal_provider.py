"""The Modal provider's file scripts in a real shell; `tools cleanup --modal` as a process."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

from sandbox_tools.sandboxes.modal import (
    _READ_CHUNK,
    _READ_SIZE,
    _WRITE_BEGIN,
    _WRITE_CHUNK,
    _WRITE_COMMIT,
    base64_chunks,
    chunk_count,
)


def sh(script: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", script, "sh", *args], input=stdin, capture_output=True)


def test_the_file_scripts_round_trip_in_a_real_shell(tmp_path: Path) -> None:
    """The exact scripts the provider sends, run by /bin/sh here: binary-safe, quoting-free."""
    target = str(tmp_path / "new dir" / "$(touch pwned);x")
    data = bytes(range(256)) * 50
    assert sh(_WRITE_BEGIN, target).returncode == 0
    for chunk in base64_chunks(data, 1000):
        assert sh(_WRITE_CHUNK, target, stdin=chunk).returncode == 0
    assert sh(_WRITE_COMMIT, target, "755").returncode == 0
    assert Path(target).read_bytes() == data
    assert oct(Path(target).stat().st_mode & 0o777) == "0o755"
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()

    size = int(sh(_READ_SIZE, target).stdout)
    back = b"".join(
        base64.b64decode(sh(_READ_CHUNK, target, "1000", str(i)).stdout)
        for i in range(chunk_count(size, 1000))
    )
    assert back == data
    assert sh(_READ_SIZE, str(tmp_path / "missing")).returncode == 3
    assert sh(_READ_SIZE, str(tmp_path)).returncode == 4


def test_cleanup_without_sdk_or_credentials_says_what_to_do() -> None:
    """The real CLI: a clear remedy, printed literally (rich must not eat `[modal]`)."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAL_")}
    env["MODAL_CONFIG_PATH"] = "/nonexistent/.modal.toml"
    result = subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", "cleanup", "--modal"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 2
    assert (
        "pip install 'sandbox-tools[modal]'" in result.stderr
        or "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET" in result.stderr
    )
