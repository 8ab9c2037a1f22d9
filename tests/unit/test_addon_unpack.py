"""The add-on's unpacking and its in-place check (runtime/addons.py), on hostile archives.

THREAT_MODEL.md, "Delivering the add-on": the archive is the host's pinned bytes, but it
is unpacked as hostile input anyway; nothing is in place before its tree digest
matches, whether it came as tar.xz or as the plain tar an engine on the host gets; a
tree is reused only if the in-place walk finds the pinned digest, owners
root or the installer, and nobody else able to write. The real add-on goes through the
same code in tests/integration/test_browser_delivery.py.
"""

from __future__ import annotations

import io
import lzma
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.runtime.addons import (
    PLAIN,
    TREE_ALGORITHM,
    XZ,
    AddonError,
    check,
    digest_of_archive,
    digest_of_tree,
    install,
)

NO_TREE = f"{TREE_ALGORITHM}:" + "0" * 64  # a well-formed pin no tree has
Member = tuple[str, str, bytes | str, int]  # name, kind (f, d, l, other), content or target, mode


def _archive(members: list[Member], fmt: str = XZ) -> bytes:
    """A tar.xz as the add-on is packed: two concatenated xz streams (as the real one is
    made of pieces), to show that unpacking reads past the first; with `fmt` PLAIN, the
    tar itself."""
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
    if fmt == PLAIN:
        return raw
    half = len(raw) // 2
    return lzma.compress(raw[:half]) + lzma.compress(raw[half:])


GOOD: list[Member] = [
    ("lib", "d", b"", 0o755),
    ("lib/libx.so", "f", b"\x7fELF library", 0o644),
    ("chrome", "f", b"#!/bin/sh\necho browser\n", 0o755),
    ("lib/libx.so.1", "l", "libx.so", 0o777),
    ("fonts.conf", "f", b"<fontconfig/>", 0o664),  # group write: dropped on unpacking
]


def _pins(data: bytes, fmt: str = XZ) -> tuple[str, int]:
    tree = digest_of_archive(io.BytesIO(data), fmt)
    return tree.digest, tree.size


def _install(
    tmp_path: Path, data: bytes, digest: str | None = None, fmt: str = XZ
) -> dict[str, object]:
    pinned, size = _pins(data, fmt)
    return install(str(tmp_path / "browser"), digest or pinned, size, io.BytesIO(data), fmt)


def _nothing_left(tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_good_archive_is_unpacked_checked_and_found_in_place(tmp_path: Path) -> None:
    data = _archive(GOOD)
    answer = _install(tmp_path, data)
    assert answer["state"] == "installed"
    tree = tmp_path / "browser"
    assert (tree / "chrome").read_bytes().startswith(b"#!/bin/sh")
    assert os.readlink(tree / "lib/libx.so.1") == "libx.so"
    assert stat.S_IMODE((tree / "fonts.conf").stat().st_mode) == 0o644
    assert stat.S_IMODE(tree.stat().st_mode) == 0o755
    digest, _ = _pins(data)
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
    digest, _ = _pins(data)
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
    answer = check(str(tmp_path / "browser"), NO_TREE)
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
        install(str(tmp_path / "browser"), NO_TREE, 10, io.BytesIO(data))
    _nothing_left(tmp_path)


@pytest.mark.parametrize("fmt", [XZ, PLAIN])
def test_other_bytes_or_another_tree_are_refused_before_anything_is_in_place(
    tmp_path: Path, fmt: str
) -> None:
    data = _archive(GOOD, fmt)
    digest, size = _pins(data, fmt)
    with pytest.raises(AddonError, match="tree's digest"):
        _install(tmp_path, data, digest=NO_TREE, fmt=fmt)
    _nothing_left(tmp_path)
    # One byte of one file's content changed: the tar still unpacks, the tree differs.
    changed = data if fmt == XZ else data.replace(b"echo browser", b"echo planted")
    if fmt == PLAIN:
        with pytest.raises(AddonError, match="tree's digest"):
            install(str(tmp_path / "browser"), digest, size, io.BytesIO(changed), fmt)
        _nothing_left(tmp_path)
    # Cut inside a file's content (a plain tar's second half is mostly padding).
    cut = io.BytesIO(data[: len(data) // 2 if fmt == XZ else data.index(b"echo browser") + 4])
    with pytest.raises(AddonError, match="cannot be unpacked"):
        install(str(tmp_path / "browser"), digest, size, cut, fmt)
    _nothing_left(tmp_path)
    # Cut exactly after a member: no error from tar, the missing entries differ.
    whole = _archive(GOOD[:2], PLAIN)
    with pytest.raises(AddonError, match="tree's digest"):
        install(str(tmp_path / "browser"), digest, size, io.BytesIO(whole), PLAIN)
    _nothing_left(tmp_path)


def test_the_plain_tar_unpacks_to_the_same_pinned_tree_as_the_archive(tmp_path: Path) -> None:
    """An engine on the host gets the plain tar: the pin (the tree digest) is the same."""
    assert _pins(_archive(GOOD)) == _pins(_archive(GOOD, PLAIN), PLAIN)
    digest, _ = _pins(_archive(GOOD))
    assert _install(tmp_path, _archive(GOOD, PLAIN), fmt=PLAIN)["state"] == "installed"
    assert check(str(tmp_path / "browser"), digest)["state"] == "ok"


def test_a_tree_pinned_with_sha256_by_an_older_build_is_checked_with_sha256(
    tmp_path: Path,
) -> None:
    """The digest's prefix names its hash: records made before BLAKE2b still install."""
    data = _archive(GOOD)
    old = digest_of_archive(io.BytesIO(data), algorithm="sha256")
    new = digest_of_archive(io.BytesIO(data))
    assert old.digest.startswith("sha256:") and new.digest.startswith(f"{TREE_ALGORITHM}:")
    assert _install(tmp_path, data, digest=old.digest)["state"] == "installed"
    assert check(str(tmp_path / "browser"), old.digest)["state"] == "ok"


@pytest.mark.parametrize(
    ("digest", "fmt", "reason"),
    [
        ("md5:" + "0" * 32, XZ, "not a tree digest"),
        ("sha256:0", XZ, "not a tree digest"),
        (NO_TREE, "zip", "not 'zip'"),
    ],
)
def test_a_malformed_pin_or_format_is_refused_before_a_byte_is_read(
    tmp_path: Path, digest: str, fmt: str, reason: str
) -> None:
    class Unread(io.BytesIO):
        def read(self, size: int | None = -1, /) -> bytes:
            raise AssertionError("read before the pin was checked")

    with pytest.raises(AddonError, match=reason):
        install(str(tmp_path / "browser"), digest, 10, Unread(), fmt)
    _nothing_left(tmp_path)


def test_the_setuid_bit_of_a_member_is_never_unpacked(tmp_path: Path) -> None:
    data = _archive([("tool", "f", b"x", 0o4755), ("dir", "d", b"", 0o2777)])
    _install(tmp_path, data)
    tree = tmp_path / "browser"
    assert stat.S_IMODE((tree / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "dir").stat().st_mode) == 0o755


def test_too_little_space_is_refused_before_unpacking(tmp_path: Path) -> None:
    data = _archive(GOOD)
    digest, _ = _pins(data)
    with pytest.raises(AddonError, match="MiB free in"):
        install(str(tmp_path / "browser"), digest, 1 << 60, io.BytesIO(data))
    _nothing_left(tmp_path)


def test_the_tree_digest_travels_in_the_record_and_validate_checks_it(tmp_path: Path) -> None:
    """No host hashes the ~300 MiB tree at eval time: the record carries what the
    archive unpacks to (build.json, then the manifest, read back whole), the injector
    takes it from there, and the static checks (tools validate) refuse a record whose
    digest is not the archive's, or that has none."""
    from dataclasses import replace

    from sandbox_tools.artifacts import Artifact
    from sandbox_tools.distro_matrix.static import _tree_problems
    from sandbox_tools.errors import SandboxInjectionError
    from sandbox_tools.injector.addon_delivery import _tree_of
    from tests.support import addon_record

    archive = tmp_path / "addon.tar.xz"
    archive.write_bytes(_archive(GOOD))
    record = addon_record(archive)
    tree = record.tree
    assert Artifact.from_json(record.to_json()) == record
    assert Artifact.from_json(record.to_json(urls=True)) == record
    assert _tree_of(record) == tree and _tree_problems(archive, record) == []
    other = replace(tree, digest=NO_TREE)
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
    from sandbox_tools.artifacts import ArtifactKind
    from sandbox_tools.errors import SandboxInjectionError
    from sandbox_tools.injector.addon_delivery import ADDONS, _free_bytes

    desktop = ADDONS[ArtifactKind.DESKTOP]
    with pytest.raises(SandboxInjectionError, match=r"checking the desktop add-on .*free_bytes"):
        _free_bytes(desktop, {"state": "missing", "free_bytes": free}, "box")
    assert _free_bytes(desktop, {"state": "missing", "free_bytes": 5}, "box") == 5


def test_a_stream_that_fails_half_way_fails_the_install_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The archive is read ahead in a thread of its own: its failure (a broken pipe from
    the engine) is the install's, raised where the tree is unpacked, not lost with the
    thread."""
    data = _archive(GOOD, PLAIN)
    digest, size = _pins(data, PLAIN)

    class Breaking(io.BytesIO):
        def readinto(self, buffer: Any, /) -> int:
            if self.tell() > 1024:
                raise OSError("the engine closed the stream")
            return super().readinto(memoryview(buffer)[:1024])

    with pytest.raises(OSError, match="closed the stream"):
        install(str(tmp_path / "browser"), digest, size, Breaking(data), PLAIN)
    _nothing_left(tmp_path)


LONG = "d" * 60 + "/" + "f" * 150  # over ustar's 100 bytes of name: a record carries it


@pytest.mark.parametrize("tar_format", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_names_and_link_targets_come_from_their_records(
    tmp_path: Path, tar_format: int
) -> None:
    """A pax header or a GNU long-name entry carries a name or link target over 100
    bytes; the unpacked tree has them, and its digest is the one the archive pins."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tar_format) as tar:
        directory = tarfile.TarInfo(LONG.split("/")[0])
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(directory)
        content = b"x" * 3000
        info = tarfile.TarInfo(LONG)
        info.size, info.mode = len(content), 0o644
        tar.addfile(info, io.BytesIO(content))
        link = tarfile.TarInfo(LONG.split("/")[0] + "/link")
        link.type, link.linkname = tarfile.SYMTYPE, LONG.split("/")[1]
        tar.addfile(link)
    data = plain.getvalue()
    assert (b"././@LongLink" in data) == (tar_format == tarfile.GNU_FORMAT)
    answer = _install(tmp_path, data, fmt=PLAIN)
    assert answer["state"] == "installed"
    assert (tmp_path / "browser" / LONG).read_bytes() == content
    assert os.readlink(tmp_path / "browser" / LONG.split("/")[0] / "link") == LONG.split("/")[1]
    digest, _ = _pins(data, PLAIN)
    assert digest_of_tree(str(tmp_path / "browser"), frozenset({os.getuid()})).digest == digest


def _header(name: str, kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info


def _raw_tar(*entries: tuple[tarfile.TarInfo, bytes]) -> bytes:
    """A plain tar of hand-made headers and their bytes, as tarfile's writer would not
    make them (a GNU sparse member, a huge name record, a malformed pax header)."""
    out = b""
    for info, payload in entries:
        out += info.tobuf(tarfile.GNU_FORMAT) + payload + b"\0" * (-len(payload) % 512)
    return out + b"\0" * 1024


def _pax(records: bytes, then: str = "x") -> bytes:
    return _raw_tar(
        (_header("PaxHeaders/x", tarfile.XHDTYPE, len(records)), records),
        (_header(then, tarfile.REGTYPE, 0), b""),
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(
            _raw_tar((_header("x", tarfile.GNUTYPE_SPARSE, 1), b"x")),
            "not a file, directory or link",
            id="gnu-sparse",
        ),
        pytest.param(
            _raw_tar((_header("L", tarfile.GNUTYPE_LONGNAME, 1 << 20), b"a" * (1 << 20))),
            "name record of",
            id="huge-name-record",
        ),
        pytest.param(_pax(b"99 path=x\n"), "pax header", id="pax-length-past-its-end"),
        pytest.param(_pax(b"12 pathx=yz"), "pax header", id="pax-record-without-newline"),
        pytest.param(_pax(b"9 noequal\n"), "pax header", id="pax-record-without-equals"),
        pytest.param(_pax(b"11 size=99\n"), "8 GiB or more", id="pax-size"),
        pytest.param(_pax(b"15 path=/etc/x\n"), "unsafe name", id="pax-absolute-path"),
        pytest.param(
            _raw_tar((_header("x", tarfile.REGTYPE, 0), b""))[:148]
            + b"0000000\0"
            + _raw_tar((_header("x", tarfile.REGTYPE, 0), b""))[156:],
            "malformed header",
            id="bad-checksum",
        ),
        pytest.param(
            _raw_tar((_header("x", tarfile.REGTYPE, 5000), b"y" * 5000))[:3000],
            "cannot be unpacked",
            id="cut-in-content",
        ),
    ],
)
def test_malformed_or_unplain_records_are_refused_and_nothing_is_left(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    with pytest.raises(AddonError, match=reason):
        install(str(tmp_path / "browser"), NO_TREE, 10, io.BytesIO(data), PLAIN)
    _nothing_left(tmp_path)
