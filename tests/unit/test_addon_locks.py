"""The add-ons' inputs, without an engine: the committed locks, what a lock line
says, where a package is downloaded from, what the build id covers, and the packer's
output read back by the standard library."""

from __future__ import annotations

import lzma
import tarfile
from pathlib import Path

import pytest

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.build_containers.addon import parse_lock, read_lock
from sandbox_tools.build_containers.addon_recipes import ADDONS
from sandbox_tools.build_containers.records import addon_build_id, addon_build_inputs
from sandbox_tools.build_containers.tree_archive import XZ_PIECE, read_archive, write_archive
from sandbox_tools.errors import BuildError
from sandbox_tools.platforms import Arch


@pytest.mark.parametrize("arch", list(Arch), ids=lambda a: a.value)
def test_the_committed_locks_pin_chromium_from_bookworm_for_their_architecture(
    arch: Arch,
) -> None:
    packages = {p.name: p for p in read_lock(ADDONS[ArtifactKind.BROWSER], arch)}
    for name in ("chromium-headless-shell", "chromium-common", "libc6", "libnss3"):
        assert packages[name].arch == arch.value, name
        assert packages[name].url.startswith("http://deb.debian.org/debian")
        assert len(packages[name].sha256) == 64 and packages[name].size > 0
    assert packages["fonts-dejavu-core"].arch == "all"
    assert "deb12" in packages["chromium-headless-shell"].version  # bookworm's security build
    # The closure, not the package set: what Chromium never loads stays out.
    assert not {"libllvm15", "libgl1-mesa-dri", "libz3-4"} & set(packages)


def test_a_lock_line_and_its_licence_only_marker() -> None:
    text = (
        "# a comment\n"
        "libc6:amd64=2.36-9+deb12u14 " + "a" * 64 + " 2759 "
        "http://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb\n"
        "gcc-12-base:amd64=12.2.0-14+deb12u1 " + "b" * 64 + " 37 "
        "http://deb.debian.org/debian/pool/main/g/gcc-12/gcc-12-base_12.2.0_amd64.deb"
        "  # licence only\n"
    )
    libc, base = parse_lock(text)
    assert (libc.name, libc.arch, libc.version, libc.size) == (
        "libc6",
        "amd64",
        "2.36-9+deb12u14",
        2759,
    )
    assert libc.file == "libc6_2.36-9+deb12u14_amd64.deb"
    assert not libc.licence_only and base.licence_only
    with pytest.raises(BuildError, match="line 1 is malformed"):
        parse_lock("libc6:amd64=2.36 abc\n")


def test_packages_come_from_the_configured_mirror_and_security_from_its_archive() -> None:
    main, security = parse_lock(
        "a:amd64=1 " + "0" * 64 + " 1 http://deb.debian.org/debian/pool/main/a/a/a_1_amd64.deb\n"
        "b:amd64=2 " + "0" * 64 + " 1 "
        "http://deb.debian.org/debian-security/pool/updates/main/b/b/b_2_amd64.deb\n"
    )
    mirror = "http://mirror.example/debian/"
    assert main.source_url(mirror) == "http://mirror.example/debian/pool/main/a/a/a_1_amd64.deb"
    assert security.source_url(mirror) == security.url


@pytest.mark.parametrize("kind", list(ADDONS), ids=lambda k: k.value)
def test_the_build_id_covers_the_lock_the_recipe_and_the_architecture(kind: ArtifactKind) -> None:
    amd64 = addon_build_id(kind, Arch.AMD64)
    assert amd64 == addon_build_id(kind, Arch.AMD64) != addon_build_id(kind, Arch.ARM64)
    assert amd64.startswith("sha256:") and len(amd64) == 7 + 64
    names = {p.name for p in addon_build_inputs(kind)}
    locks = {f"{kind.value}-amd64.lock", f"{kind.value}-arm64.lock"}
    assert {*locks, "assemble.py", "launcher.c"} <= names
    assert {"elf.py", "tree_archive.py", "debian_tree.py", "addon.py", "addon_recipes.py"} <= names


def test_each_add_on_has_its_own_build_id() -> None:
    ids = {addon_build_id(kind, arch) for kind in ADDONS for arch in Arch}
    assert len(ids) == len(ADDONS) * len(Arch)


def test_the_packer_writes_a_deterministic_tree_that_tarfile_reads(tmp_path: Path) -> None:
    program = tmp_path / "program"
    program.write_bytes(b"\x7fELF" + bytes(range(256)) * 4096)
    program.chmod(0o700)
    notes = tmp_path / "notes"
    notes.write_bytes(b"x" * (XZ_PIECE + 10))  # two xz streams, one after the other
    files = {"bin/program": str(program), "share/doc/notes": str(notes)}
    first, second = tmp_path / "first.tar.xz", tmp_path / "second.tar.xz"
    write_archive(files, {"about.json": b"{}\n"}, str(first))
    program.touch()
    write_archive(files, {"about.json": b"{}\n"}, str(second))
    assert first.read_bytes() == second.read_bytes()
    members = {m.name: (m, content) for m, content in read_archive(str(first))}
    assert list(members) == [
        "bin",
        "share",
        "share/doc",
        "about.json",
        "bin/program",
        "share/doc/notes",
    ]
    program_member, content = members["bin/program"]
    assert content == program.read_bytes() and program_member.mode == 0o755
    assert members["share/doc/notes"][0].mode == 0o644
    assert {(m.uid, m.gid, m.uname, m.mtime) for m, _ in members.values()} == {
        (0, 0, "", 315532800)
    }
    with lzma.open(first) as plain, tarfile.open(fileobj=plain) as tar:
        assert len(tar.getnames()) == 6


@pytest.mark.parametrize("arch", list(Arch), ids=lambda a: a.value)
def test_the_committed_desktop_locks_pin_the_x_server_and_its_programs(arch: Arch) -> None:
    packages = {p.name: p for p in read_lock(ADDONS[ArtifactKind.DESKTOP], arch)}
    for name in ("xvfb", "x11-xkb-utils", "xdotool", "twm", "xterm", "libc6", "libc-bin"):
        assert packages[name].arch == arch.value, name
        assert packages[name].url.startswith("http://deb.debian.org/debian")
    for name in ("xkb-data", "libx11-data", "fonts-dejavu-core"):
        assert packages[name].arch == "all", name
    assert "deb12" in packages["xvfb"].version  # bookworm's security build
    # The closure, not the package set: Xvfb's Depends bring what it never loads.
    assert not {"xserver-common", "xauth", "libgl1-mesa-dri"} & set(packages)


def test_the_desktop_launcher_and_shim_read_the_variables_the_runtime_sets() -> None:
    """The names are declared once in protocol.py; the C sources spell them again."""
    from sandbox_tools.protocol import DESKTOP_KEYMAPS_ENV, DESKTOP_PARENT_ENV

    resources = ADDONS[ArtifactKind.DESKTOP].resources
    launcher = (resources / "launcher.c").read_text()
    assert f'#define PARENT_VARIABLE "{DESKTOP_PARENT_ENV}"' in launcher
    shim = (resources / "xkbcomp_shim.c").read_text()
    assert f'#define KEYMAPS_VARIABLE "{DESKTOP_KEYMAPS_ENV}"' in shim
