"""The builder root is pinned: a build id stands for one exact package set."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sandbox_tools.build_containers import builder
from sandbox_tools.errors import BuildError
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.images import installed_packages

STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u14

Package: gcc-12
Status: install ok installed
Architecture: amd64
Version: 12.2.0-14
Description: the GNU C compiler
 with a continuation line: that is not a field

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


def root(tmp_path: Path, status: str = STATUS) -> Path:
    path = tmp_path / "root.tar"
    with tarfile.open(path, "w") as tar:
        data = status.encode()
        info = tarfile.TarInfo("./var/lib/dpkg/status")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_installed_packages_are_read_from_the_dpkg_status(tmp_path: Path) -> None:
    assert installed_packages(root(tmp_path)) == [
        "gcc-12:amd64=12.2.0-14",
        "libc6:amd64=2.36-9+deb12u14",
    ]


def test_a_root_must_match_its_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = tmp_path / "builder-amd64.lock"
    monkeypatch.setattr(builder, "lock_path", lambda arch: lock)
    with pytest.raises(BuildError, match="no builder lock"):
        builder.check_builder_root(Arch.AMD64, root(tmp_path))

    lock.write_text(builder.LOCK_HEADER + "gcc-12:amd64=12.2.0-14\nlibc6:amd64=2.36-9+deb12u14\n")
    builder.check_builder_root(Arch.AMD64, root(tmp_path))  # the exact set: accepted

    moved = STATUS.replace("2.36-9+deb12u14", "2.36-9+deb12u15")
    with pytest.raises(BuildError) as caught:
        builder.check_builder_root(Arch.AMD64, root(tmp_path, moved))
    assert "+libc6:amd64=2.36-9+deb12u15" in caught.value.message
    assert "-libc6:amd64=2.36-9+deb12u14" in caught.value.message
    assert "--update-lock" in (caught.value.remedy or "")


def test_the_committed_locks_pin_the_toolchain_the_build_relies_on() -> None:
    for arch in Arch:
        text = builder.lock_path(arch).read_text()
        for package in ("libc6", "python3.11", "gcc-12", "musl-tools", "patchelf"):
            assert f"\n{package}:" in text, (arch, package)
    tag = builder.builder_image_tag(Arch.AMD64)
    assert tag.startswith(builder.builder_recipe(Arch.AMD64).image_tag + "-")
