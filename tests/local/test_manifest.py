"""Manifest files checked by the real `sha256sum`, and `tools manifest show` run as a process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import (
    manifest_from_records,
    verify_local,
    write_release_files,
)

GOLDEN = Path(__file__).parents[1] / "golden"


def test_written_sums_pass_sha256sum_and_verify_catches_changes(tmp_path: Path) -> None:
    import hashlib

    blobs = {"sandbox-tools-9-linux-amd64": b"amd64 bytes", "sandbox-tools-9-linux-arm64": b"a"}
    chosen = []
    for name, data in blobs.items():
        (tmp_path / name).write_bytes(data)
        chosen.append(
            Artifact(
                name=name,
                arch=Arch.parse(name.rsplit("-", 1)[1]),
                format=ArtifactFormat.PORTABLE,
                size=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                build_id="x",
            )
        )
    manifest = manifest_from_records("9", chosen)
    write_release_files(tmp_path, manifest)
    check = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert verify_local(tmp_path, manifest) == []
    (tmp_path / "sandbox-tools-9-linux-amd64").write_bytes(b"amd64 bytez")
    (tmp_path / "sandbox-tools-9-linux-arm64").unlink()
    problems = verify_local(tmp_path, manifest)
    assert any("amd64: sha256" in p for p in problems)
    assert any("arm64: missing" in p for p in problems)


def test_manifest_show_json_is_the_manifest(tmp_path: Path) -> None:
    import subprocess
    import sys

    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_tools.cli",
            "manifest",
            "show",
            "--json",
            "--manifest",
            str(GOLDEN / "manifest.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout) == json.loads((GOLDEN / "manifest.json").read_text())
