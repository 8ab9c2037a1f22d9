"""`tools validate --static` reading the payload back, on real ELF files.

The tree is this machine's own loader, libc and programs, packed by the real packer
behind the real launcher; each defect is made for real (a file left out, a library the
tree lacks, a libc whose symbol versions are too old, a tree id of another build).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.build_containers.lock import RESOURCES
from sandbox_tools.build_containers.package import pack_portable, read_metadata
from sandbox_tools.distro_matrix.static import static_checks
from sandbox_tools.platforms import Arch

HOST_LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
HOST_LOADER = Path("/lib64/ld-linux-x86-64.so.2")
BUILD_ID = "sha256:" + "ab" * 32
pytestmark = pytest.mark.skipif(
    os.uname().machine != "x86_64"
    or shutil.which("musl-gcc") is None
    or not HOST_LIBC.exists()
    or not HOST_LOADER.exists(),
    reason="needs an x86_64 glibc host with musl-tools",
)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("launcher") / "launcher"
    source = RESOURCES / "launcher.c"
    subprocess.run(["musl-gcc", "-static", "-Os", "-o", str(out), str(source)], check=True)
    return out


def tree(root: Path, libc: bytes | None = None, extra: Path | None = None) -> Path:
    (root / "lib").mkdir(parents=True)
    (root / "_internal").mkdir()
    shutil.copyfile(HOST_LOADER, root / "lib" / "ld-linux-x86-64.so.2")
    if libc is not None:
        (root / "lib" / "libc.so.6").write_bytes(libc)
    shutil.copyfile("/bin/true", root / "runtime")
    if extra is not None:
        shutil.copyfile(extra, root / "_internal" / extra.name)
    return root


METADATA = {"build_id": BUILD_ID, "platform": "linux/amd64", "format": "portable"}


def check(
    launcher: Path, root: Path, build_id: str = BUILD_ID, metadata: dict[str, str] = METADATA
) -> list[str]:
    artifact = root.parent / "sandbox-tools"
    pack_portable(launcher, root, BUILD_ID.removeprefix("sha256:")[:32], artifact, metadata)
    data = artifact.read_bytes()
    record = Artifact(
        name=artifact.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.PORTABLE,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        build_id=build_id,
    )
    return static_checks(artifact, record)


def test_a_sound_tree_passes(launcher: Path, tmp_path: Path) -> None:
    assert check(launcher, tree(tmp_path / "t", HOST_LIBC.read_bytes())) == []


def test_a_missing_libc_is_named_with_everything_that_needs_it(
    launcher: Path, tmp_path: Path
) -> None:
    problems = check(launcher, tree(tmp_path / "t", libc=None))
    assert "payload: no lib/libc.so.6" in problems
    assert "payload: runtime needs libc.so.6, which the tree lacks" in problems


def test_a_library_the_tree_lacks(launcher: Path, tmp_path: Path) -> None:
    needy = Path("/bin/ls")  # on Debian it needs libselinux besides libc
    problems = check(launcher, tree(tmp_path / "t", HOST_LIBC.read_bytes(), extra=needy))
    assert any(p.startswith("payload: _internal/ls needs lib") for p in problems), problems


def test_symbol_versions_newer_than_the_bundled_glibc(launcher: Path, tmp_path: Path) -> None:
    # The same libc with every version it defines renamed GLIBC_1.x: what /bin/true
    # needs (GLIBC_2.x) is then newer than anything it provides.
    aged = HOST_LIBC.read_bytes().replace(b"GLIBC_2.", b"GLIBC_1.")
    problems = check(launcher, tree(tmp_path / "t", aged))
    assert any(
        p.startswith("payload: runtime needs GLIBC_2.") and "newer than the bundled glibc" in p
        for p in problems
    ), problems


def test_a_tree_of_another_build(launcher: Path, tmp_path: Path) -> None:
    other = "sha256:" + "cd" * 32
    problems = check(launcher, tree(tmp_path / "t", HOST_LIBC.read_bytes()), build_id=other)
    assert any("is not the one build id" in p for p in problems)


def test_the_metadata_entry_is_read_from_the_first_block_and_checked(
    launcher: Path, tmp_path: Path
) -> None:
    root = tree(tmp_path / "t", HOST_LIBC.read_bytes())
    assert check(launcher, root) == []
    artifact = root.parent / "sandbox-tools"
    assert read_metadata(artifact.read_bytes()) == METADATA
    other = {**METADATA, "platform": "linux/arm64"}
    assert check(launcher, root, metadata=other) == [
        "payload: .sandbox-tools.json says platform 'linux/arm64', the record 'linux/amd64'"
    ]


def test_a_damaged_payload(launcher: Path, tmp_path: Path) -> None:
    root = tree(tmp_path / "t", HOST_LIBC.read_bytes())
    artifact = root.parent / "sandbox-tools"
    pack_portable(launcher, root, BUILD_ID.removeprefix("sha256:")[:32], artifact, METADATA)
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the compressed payload
    artifact.write_bytes(bytes(data))
    record = Artifact(
        name=artifact.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.PORTABLE,
        size=len(data),
        sha256="",
        build_id=BUILD_ID,
    )
    problems = static_checks(artifact, record)
    assert len(problems) == 1 and problems[0].startswith("payload: "), problems
