from __future__ import annotations

from pathlib import Path

from sandbox_tools.build_containers.records import ArtifactRecord
from sandbox_tools.distro_matrix.matrix import load_matrix
from sandbox_tools.distro_matrix.runner import static_checks


def test_packaged_matrix_has_the_required_rows_and_scenarios() -> None:
    matrix = load_matrix()
    names = {d.name for d in matrix.distros}
    assert {
        "ubuntu-20.04",
        "ubuntu-22.04",
        "ubuntu-24.04",
        "debian-11",
        "debian-12",
        "debian-13",
        "kali-rolling",
        "alpine-3.18",
        "alpine-latest",
        "busybox",
        "distroless",
    } <= names
    offline = {d.name: d.offline for d in matrix.distros if d.offline}
    assert offline["debian-13"] == "debootstrap:trixie" and offline["busybox"] == "busybox-static"
    scenarios = {s.name: s for s in matrix.scenarios}
    assert scenarios["nonroot"].user == "1000:1000"
    assert scenarios["readonly-noexec"].expect_failure and scenarios["readonly-noexec"].read_only


def test_only_accepts_names_registry_spellings_and_prefixes() -> None:
    matrix = load_matrix()
    assert [d.name for d in matrix.select(["debian:12"]).distros] == ["debian-12"]
    assert [d.name for d in matrix.select(["debian"]).distros] == [
        "debian-11",
        "debian-12",
        "debian-13",
    ]
    assert len(matrix.select(None).distros) == len(matrix.distros)


def test_static_checks_catch_dynamic_and_foreign_binaries(tmp_path: Path) -> None:
    import shutil
    import subprocess

    record = ArtifactRecord(
        name="x", platform="linux/amd64", format="staticx", size=0, sha256="", build_id=""
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


def test_which_cells_modal_can_run() -> None:
    from sandbox_tools.distro_matrix.runner import modal_skip
    from sandbox_tools.platforms import Arch

    matrix = load_matrix()
    distros = {d.name: d for d in matrix.distros}
    scenarios = {s.name: s for s in matrix.scenarios}
    assert modal_skip(distros["ubuntu-24.04"], scenarios["root"], Arch.AMD64) is None
    assert "amd64" in (modal_skip(distros["ubuntu-24.04"], scenarios["root"], Arch.ARM64) or "")
    assert "Docker options" in (
        modal_skip(distros["ubuntu-24.04"], scenarios["readonly-noexec"], Arch.AMD64) or ""
    )
    assert "registry" in (modal_skip(distros["no-shell"], scenarios["root"], Arch.AMD64) or "")
