"""The static checks against real compiled binaries."""

from __future__ import annotations

from pathlib import Path

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.distro_matrix.static import static_checks
from sandbox_tools.platforms import Arch


def test_static_checks_catch_dynamic_and_foreign_binaries(tmp_path: Path) -> None:
    import shutil
    import subprocess

    record = Artifact(
        name="x", arch=Arch.AMD64, format=ArtifactFormat.STATICX, size=0, sha256="", build_id=""
    )
    dynamic = tmp_path / "true"
    shutil.copyfile(shutil.which("true") or "/bin/true", dynamic)
    problems = static_checks(dynamic, record)
    assert any("interpreter" in p for p in problems)
    assert any("differs from the record" in p for p in problems)
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\n")
    assert static_checks(text, record)[-1] == "not a 64-bit ELF executable"
    assert subprocess.run(["true"]).returncode == 0
