"""The add-on's unpacking and its in-place check (runtime/addons.py), on hostile archives.

THREAT_MODEL.md, "Delivering the add-on": the archive is the host's pinned bytes, but it
is unpacked as hostile input anyway; nothing is in place before its SHA-256 and tree
digest match; a tree is reused only if the in-place walk finds the pinned digest, owners
root or the installer, and nobody else able to write. The real add-on goes through the
same code in tests/integration/test_browser_delivery.py.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sandbox_tools.runtime.addons import (
    AddonError,
    check,
    digest_of_archive,
    digest_of_tree,
    install,
)

Member = tuple[str, str, bytes | str, int]  # name, kind (f, d, l, other), content or target, mode


def _archive(members: list[Member]) -> bytes:
    """A tar.xz as the add-on is packed: two concatenated xz streams (as the real one is
    made of pieces), to show that unpacking reads past the first."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, content, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = str(content)
                tar.addfile(info)
            elif kind == "h":
                info.type = tarfile.LNKTYPE
                info.linkname = str(content)
                tar.addfile(info)
            elif kind == "c":
                info.type = tarfile.CHRTYPE
                tar.addfile(info)
            else:
                data = content if isinstance(content, bytes) else content.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = plain.getvalue()
    half = len(raw) // 2
    return lzma.compress(raw[:half]) + lzma.compress(raw[half:])


GOOD: list[Member] = [
    ("lib", "d", b"", 0o755),
    ("lib/libx.so", "f", b"\x7fELF library", 0o644),
    ("chrome", "f", b"#!/bin/sh\necho browser\n", 0o755),
    ("lib/libx.so.1", "l", "libx.so", 0o777),
    ("fonts.conf", "f", b"<fontconfig/>", 0o664),  # group write: dropped on unpacking
]


def _pins(data: bytes) -> tuple[str, str, int]:
    tree = digest_of_archive(io.BytesIO(data))
    return hashlib.sha256(data).hexdigest(), tree.digest, tree.size


def _install(tmp_path: Path, data: bytes, **override: str) -> dict[str, object]:
    sha256, digest, size = _pins(data)
    pins = {"sha256": sha256, "digest": digest, **override}
    return install(
        str(tmp_path / "browser"), pins["sha256"], pins["digest"], size, io.BytesIO(data)
    )


def _nothing_left(tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_good_archive_is_unpacked_checked_and_found_in_place(tmp_path: Path) -> None:
    data = _archive(GOOD)
    answer = _install(tmp_path, data)
    assert answer["state"] == "installed" and answer["bytes"] == len(data)
    tree = tmp_path / "browser"
    assert (tree / "chrome").read_bytes().startswith(b"#!/bin/sh")
    assert os.readlink(tree / "lib/libx.so.1") == "libx.so"
    assert stat.S_IMODE((tree / "fonts.conf").stat().st_mode) == 0o644
    assert stat.S_IMODE(tree.stat().st_mode) == 0o755
    _, digest, _ = _pins(data)
    assert check(str(tree), digest)["state"] == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["browser"]  # no staging left
    # A second installer that lost the race keeps the tree that is there.
    assert _install(tmp_path, data)["state"] == "present"


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(
            lambda t: (t / "chrome").write_bytes(b"#!/bin/sh\necho planted\n"), id="content"
        ),
        pytest.param(lambda t: (t / "fonts.conf").chmod(0o666), id="others-may-write"),
        pytest.param(lambda t: (t / "extra").write_bytes(b""), id="added-file"),
        pytest.param(lambda t: (t / "lib/libx.so").unlink(), id="removed-file"),
        pytest.param(lambda t: (t / "chrome").chmod(0o4755), id="setuid"),
        pytest.param(
            lambda t: (
                (t / "lib/libx.so.1").unlink(),
                (t / "lib/libx.so.1").symlink_to("/etc/passwd"),
            ),
            id="link-retargeted",
        ),
    ],
)
def test_a_changed_tree_is_different_and_replaced_by_the_next_install(
    tmp_path: Path, tamper: object
) -> None:
    data = _archive(GOOD)
    _install(tmp_path, data)
    tree = tmp_path / "browser"
    tamper(tree)  # type: ignore[operator]
    _, digest, _ = _pins(data)
    found = check(str(tree), digest)
    assert found["state"] == "different", found
    assert _install(tmp_path, data)["state"] == "installed"
    assert check(str(tree), digest)["state"] == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["browser"]  # the old one removed


def test_a_tree_owned_by_someone_else_is_different(tmp_path: Path) -> None:
    data = _archive(GOOD)
    _install(tmp_path, data)
    tree = tmp_path / "browser"
    with pytest.raises(AddonError, match="not to the installer"):
        digest_of_tree(str(tree), frozenset({os.geteuid() + 1}))


def test_a_missing_tree_is_missing_and_free_space_is_reported(tmp_path: Path) -> None:
    answer = check(str(tmp_path / "browser"), "sha256:0")
    assert answer["state"] == "missing"
    assert isinstance(answer["free_bytes"], int) and answer["free_bytes"] > 0


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        pytest.param([("/etc/cron.d/x", "f", b"x", 0o644)], "unsafe name", id="absolute"),
        pytest.param(
            [("a", "d", b"", 0o755), ("a/../../x", "f", b"x", 0o644)], "unsafe name", id="dot-dot"
        ),
        pytest.param([("a//b", "f", b"x", 0o644)], "unsafe name", id="empty-component"),
        pytest.param([("./x", "f", b"x", 0o644)], "unsafe name", id="dot"),
        pytest.param([("x", "l", "/etc/passwd", 0o777)], "points outside", id="absolute-link"),
        pytest.param(
            [("a", "d", b"", 0o755), ("a/x", "l", "../../etc", 0o777)],
            "points outside",
            id="link-up",
        ),
        pytest.param(
            [("x", "h", "chrome", 0o644)], "not a file, directory or link", id="hard-link"
        ),
        pytest.param([("x", "c", b"", 0o644)], "not a file, directory or link", id="device"),
        pytest.param([("a/x", "f", b"x", 0o644)], "before its directory", id="orphan"),
        pytest.param(
            [("l", "l", "d", 0o777), ("d", "d", b"", 0o755), ("l/x", "f", b"x", 0o644)],
            "before its directory",
            id="through-a-link",
        ),
        pytest.param([("x", "f", b"1", 0o644), ("x", "f", b"2", 0o644)], "twice", id="duplicate"),
    ],
)
def test_hostile_members_are_refused_and_nothing_is_left(
    tmp_path: Path, members: list[Member], reason: str
) -> None:
    data = _archive(members)
    with pytest.raises(AddonError, match=reason):
        install(
            str(tmp_path / "browser"),
            hashlib.sha256(data).hexdigest(),
            "sha256:0",
            10,
            io.BytesIO(data),
        )
    _nothing_left(tmp_path)


def test_other_bytes_or_another_tree_are_refused_before_anything_is_in_place(
    tmp_path: Path,
) -> None:
    data = _archive(GOOD)
    with pytest.raises(AddonError, match="not the pinned"):
        _install(tmp_path, data, sha256="0" * 64)
    _nothing_left(tmp_path)
    with pytest.raises(AddonError, match="tree's digest"):
        _install(tmp_path, data, digest="sha256:" + "0" * 64)
    _nothing_left(tmp_path)
    sha256, digest, size = _pins(data)
    cut = io.BytesIO(data[: len(data) // 2])
    with pytest.raises(AddonError, match="cannot be unpacked"):
        install(str(tmp_path / "browser"), sha256, digest, size, cut)
    _nothing_left(tmp_path)


def test_the_setuid_bit_of_a_member_is_never_unpacked(tmp_path: Path) -> None:
    data = _archive([("tool", "f", b"x", 0o4755), ("dir", "d", b"", 0o2777)])
    _install(tmp_path, data)
    tree = tmp_path / "browser"
    assert stat.S_IMODE((tree / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "dir").stat().st_mode) == 0o755


def test_too_little_space_is_refused_before_unpacking(tmp_path: Path) -> None:
    data = _archive(GOOD)
    sha256, digest, _ = _pins(data)
    with pytest.raises(AddonError, match="MiB free in"):
        install(str(tmp_path / "browser"), sha256, digest, 1 << 60, io.BytesIO(data))
    _nothing_left(tmp_path)


def test_the_tree_digest_travels_in_the_record_and_validate_checks_it(tmp_path: Path) -> None:
    """No host hashes the ~300 MiB tree at eval time: the record carries what the
    archive unpacks to (build.json, then the manifest, read back whole), the injector
    takes it from there, and the static checks (tools validate) refuse a record whose
    digest is not the archive's, or that has none."""
    from dataclasses import replace

    from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind
    from sandbox_tools.distro_matrix.static import _tree_problems
    from sandbox_tools.errors import SandboxInjectionError
    from sandbox_tools.injector.browser_addon import _tree_of
    from sandbox_tools.platforms import Arch

    archive = tmp_path / "addon.tar.xz"
    archive.write_bytes(_archive(GOOD))
    tree = digest_of_archive(io.BytesIO(archive.read_bytes()))
    record = Artifact(
        name=archive.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
        size=archive.stat().st_size,
        sha256=hashlib.sha256(archive.read_bytes()).hexdigest(),
        build_id="sha256:" + "1" * 64,
        tree=tree,
    )
    assert Artifact.from_json(record.to_json()) == record
    assert Artifact.from_json(record.to_json(urls=True)) == record
    assert _tree_of(record) == tree and _tree_problems(archive, record) == []
    other = replace(tree, digest="sha256:" + "0" * 64)
    assert "is not the archive's" in _tree_problems(archive, replace(record, tree=other))[0]
    assert "no tree digest" in _tree_problems(archive, replace(record, tree=None))[0]
    with pytest.raises(SandboxInjectionError, match="no tree digest"):
        _tree_of(replace(record, tree=None))
    for bad in ({"digest": "md5:x", "size": 1, "entries": 1}, {"digest": tree.digest}, [1]):
        with pytest.raises(ValueError, match="'tree' must be"):
            Artifact.from_json({**record.to_json(), "tree": bad})


@pytest.mark.parametrize("free", [float("inf"), [1], True, -1, "9", None])
def test_a_hostile_free_space_answer_is_a_typed_error(free: object) -> None:
    """Rule 3: whatever answers `addon-check` in the sandbox may send any JSON; the host
    refuses what is not a count with SandboxInjectionError (it raised OverflowError and
    TypeError before)."""
    from sandbox_tools.errors import SandboxInjectionError
    from sandbox_tools.injector.browser_addon import _free_bytes

    with pytest.raises(SandboxInjectionError, match="free_bytes"):
        _free_bytes({"state": "missing", "free_bytes": free}, "box")
    assert _free_bytes({"state": "missing", "free_bytes": 5}, "box") == 5
