"""The static launcher and the packer, for real: compiled with musl-gcc, run here."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox_tools.build_containers.lock import RESOURCES
from sandbox_tools.build_containers.package import TRAILER, build_archive, pack_portable

pytestmark = pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="needs musl-tools")
LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}[os.uname().machine]
TREE_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("launcher") / "launcher"
    subprocess.run(
        ["musl-gcc", "-static", "-Os", "-o", str(out), str(RESOURCES / "launcher.c")], check=True
    )
    return out


def fake_tree(root: Path) -> Path:
    """A tree whose 'loader' is a script that prints what it was started with."""
    (root / "lib").mkdir(parents=True)
    (root / "_internal" / "pkg").mkdir(parents=True)
    loader = root / "lib" / LOADER
    loader.write_text(
        '#!/bin/sh\necho "args: $*"\necho "archive: $_PYI_ARCHIVE_FILE"\n'
        'echo "level: $_PYI_PARENT_PROCESS_LEVEL"\necho "self: $SANDBOX_TOOLS_SELF"\n'
    )
    loader.chmod(0o755)
    (root / "runtime").write_bytes(b"\x7fELF fake bootloader")
    (root / "_internal" / "pkg" / "data.bin").write_bytes(os.urandom(300_000) * 3)
    (root / "_internal" / "link").symlink_to("pkg/data.bin")
    return root


def test_unpacks_once_and_runs_the_bundled_loader(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)

    out = subprocess.run([str(artifact), "healthcheck", "x y"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    unpacked = install / f"runtime-{TREE_ID}"
    lines = out.stdout.splitlines()
    assert lines[0] == (
        f"args: --library-path {unpacked}/lib:{unpacked}/_internal "
        f"--inhibit-cache --argv0 {unpacked}/runtime {unpacked}/runtime "
        "healthcheck x y"
    )
    assert lines[1:] == [f"archive: {unpacked}/runtime", "level: -1", f"self: {artifact}"]
    assert (unpacked / "_internal" / "pkg" / "data.bin").read_bytes() == (
        tree / "_internal" / "pkg" / "data.bin"
    ).read_bytes()
    assert os.readlink(unpacked / "_internal" / "link") == "pkg/data.bin"
    assert oct((unpacked / "lib" / LOADER).stat().st_mode & 0o777) == oct(0o755)
    assert oct((unpacked / "runtime").stat().st_mode & 0o777) == oct(0o644)

    # Second start: nothing is unpacked again (the tree keeps its inode).
    inode = (unpacked / "_internal" / "pkg" / "data.bin").stat().st_ino
    subprocess.run([str(artifact), "version"], check=True, capture_output=True)
    assert (unpacked / "_internal" / "pkg" / "data.bin").stat().st_ino == inode
    assert sorted(p.name for p in install.iterdir()) == ["runtime-" + TREE_ID, "sandbox-tools"]


def test_concurrent_first_runs_unpack_one_tree(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    with ThreadPoolExecutor(10) as pool:
        results = list(
            pool.map(lambda _: subprocess.run([str(artifact), "x"], capture_output=True), range(10))
        )
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "runtime-" + TREE_ID,
        "sandbox-tools",
        "tree",
    ]  # no staging directory left behind


def test_corrupted_payload_is_refused_and_leaves_no_tree(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    data = bytearray(artifact.read_bytes())
    middle = launcher.stat().st_size + (len(data) - launcher.stat().st_size - TRAILER.size) // 2
    data[middle] ^= 0xFF
    artifact.write_bytes(bytes(data))
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "corrupted" in out.stderr
    assert not (install / f"runtime-{TREE_ID}").exists()

    truncated = install / "truncated"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    truncated.chmod(0o755)
    out = subprocess.run([str(truncated), "version"], capture_output=True, text=True)
    assert out.returncode != 0 and "sandbox-tools artifact" in out.stderr


def test_exec_answers_parse_errors_without_python(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    out = subprocess.run([str(artifact), "exec", "  \n "], capture_output=True, text=True)
    assert out.returncode == 0
    assert '"code":-32700' in out.stdout


def test_archive_is_deterministic(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    first = build_archive(tree)
    os.utime(tree / "runtime", (0, 0))  # timestamps are not part of the archive
    assert build_archive(tree) == first
