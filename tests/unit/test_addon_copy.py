"""The host's plain copy of an add-on archive (injector/addon_copy.py), on real files.

An engine on this host gets the add-on as its plain tar: made once per archive, checked
against the pins while it is made, never kept when it does not match them, and made
again when it changed on the host since (the sandbox's check catches that; the host
then drops it). Two makers at once make one copy; a killed maker's leftovers go.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import tarfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_tools.artifacts import Artifact
from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.addon_copy import forget_if_changed, plain_copy
from sandbox_tools.runtime.addons import PLAIN, digest_of_archive
from tests.support import addon_record


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("chrome", b"#!/bin/sh\necho browser\n"), ("lib.so", b"\x7fELF" * 50)):
            info = tarfile.TarInfo(name)
            info.mode, info.size = 0o755, len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def addon(tmp_path: Path) -> Artifact:
    archive = tmp_path / "addon.tar.xz"
    archive.write_bytes(lzma.compress(_tar()))
    return addon_record(archive, located=True)  # type: ignore[no-any-return]


def test_the_copy_is_the_archive_decompressed_and_made_once(
    addon: Artifact, tmp_path: Path
) -> None:
    copies = tmp_path / "copies"
    copy = plain_copy(addon, copies)
    assert copy.path.read_bytes() == _tar()
    assert copy.sha256 == hashlib.sha256(_tar()).hexdigest() and copy.size == len(_tar())
    assert digest_of_archive(io.BytesIO(copy.path.read_bytes()), PLAIN) == addon.tree
    made_at = copy.path.stat().st_mtime_ns
    assert plain_copy(addon, copies) == copy  # found by its record: not made again
    assert copy.path.stat().st_mtime_ns == made_at
    assert sorted(p.name for p in copies.iterdir()) == sorted(
        [f"{addon.sha256}.tar", f"{addon.sha256}.json", f"{addon.sha256}.tar.lock"]
    )


@pytest.mark.parametrize("what", ["archive", "tree"])
def test_an_archive_that_is_not_the_pinned_one_is_never_copied(
    addon: Artifact, tmp_path: Path, what: str
) -> None:
    copies = tmp_path / "copies"
    if what == "archive":
        addon.located.write_bytes(lzma.compress(_tar().replace(b"browser", b"planted")))
        match = "its SHA-256 is"
    else:
        assert addon.tree is not None
        addon = replace(addon, tree=replace(addon.tree, digest="blake2b:" + "0" * 64))
        match = "it unpacks to the tree"
    with pytest.raises(SandboxInjectionError, match=match):
        plain_copy(addon, copies)
    assert [p.name for p in copies.iterdir()] == [f"{addon.sha256}.tar.lock"]


def test_a_copy_changed_on_the_host_is_dropped_and_made_again(
    addon: Artifact, tmp_path: Path
) -> None:
    copies = tmp_path / "copies"
    copy = plain_copy(addon, copies)
    assert not forget_if_changed(copy)  # unchanged: kept
    changed = copy.path.read_bytes().replace(b"browser", b"planted")
    copy.path.write_bytes(changed)  # the same size: the record alone cannot tell
    assert forget_if_changed(copy)
    assert not copy.path.exists()
    again = plain_copy(addon, copies)
    assert again.path.read_bytes() == _tar()


def test_two_makers_at_once_make_one_copy_and_leftovers_go(addon: Artifact, tmp_path: Path) -> None:
    copies = tmp_path / "copies"
    copies.mkdir()
    left = copies / f".{addon.sha256}.tar.abc123.partial"  # a killed maker's
    left.write_bytes(b"half")
    made: list[object] = []
    threads = [
        threading.Thread(target=lambda: made.append(plain_copy(addon, copies))) for _ in "ab"
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 2 and made[0] == made[1]
    assert not left.exists()
    assert not list(copies.glob("*.partial"))


def test_the_copies_directory_removed_underneath_is_made_again(
    addon: Artifact, tmp_path: Path
) -> None:
    import shutil

    copies = tmp_path / "copies"
    plain_copy(addon, copies)
    shutil.rmtree(copies)
    assert plain_copy(addon, copies).path.read_bytes() == _tar()
