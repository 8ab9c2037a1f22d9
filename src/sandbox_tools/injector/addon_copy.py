"""An add-on's archive decompressed once on the host, for sandboxes whose bytes are cheap.

xz decompression on one core in the sandbox was most of a browser's first call (about
7 of 8 s); the bytes themselves cross a local engine's exec stream at about 300 MiB/s.
So where the engine runs on this host (`Sandbox.bytes_are_cheap`) the add-on travels as
its plain tar, decompressed here once per archive and kept in the cache beside a small
record: `<archive sha256>.tar` and `<archive sha256>.json`.

The copy is made from the located archive in one pass, which checks on the way that the
archive has the pinned SHA-256 and that the tar unpacks to the pinned tree digest; a
copy that fails either is never kept. The copy is a cache, not a pin: the sandbox checks
the tree it unpacked against the pinned tree digest on every install, so a copy changed
on the host afterwards fails there (and `forget_if_changed`
drops it, so the next call makes it again). No digest is computed on the host when a
copy exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import lzma
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sandbox_tools.artifacts import Artifact, ArtifactFormat, sha256_of
from sandbox_tools.cache import one_builder
from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.runtime.addons import (
    PLAIN,
    AddonError,
    Readable,
    algorithm_of,
    digest_of_archive,
)

__all__ = ["ADDON_COPIES", "PlainCopy", "forget_if_changed", "plain_copy"]

# The copies' directory in the cache.
ADDON_COPIES = "addon-copies"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlainCopy:
    """The plain tar of an add-on archive on the host, and what the sandbox checks it by."""

    path: Path
    sha256: str
    size: int


def _paths(artifact: Artifact, directory: Path) -> tuple[Path, Path]:
    return directory / f"{artifact.sha256}.tar", directory / f"{artifact.sha256}.json"


def _recorded(artifact: Artifact, directory: Path) -> PlainCopy | None:
    """The copy the record describes, if the record is whole and the file has its size."""
    tar, record = _paths(artifact, directory)
    try:
        said = json.loads(record.read_text())
        sha256, size = said["sha256"], said["size"]
        if not (isinstance(sha256, str) and isinstance(size, int)) or said["tree"] != (
            artifact.tree.digest if artifact.tree else None
        ):
            return None
        if tar.stat().st_size != size:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return PlainCopy(tar, sha256, size)


def plain_copy(artifact: Artifact, directory: Path) -> PlainCopy:
    """The plain tar of `artifact` (a located tar.xz add-on with a tree digest) in
    `directory`, made now if there is none; one maker per host at a time."""
    if artifact.format is not ArtifactFormat.TAR_XZ or artifact.tree is None:
        raise ValueError(f"{artifact.name} is not an add-on archive with a tree digest")
    found = _recorded(artifact, directory)
    if found is not None:
        return found
    tar, record = _paths(artifact, directory)
    with one_builder(tar):
        found = _recorded(artifact, directory)
        if found is not None:
            return found
        # What a maker killed half-way left (the lock is ours: nobody writes them now).
        for left in directory.glob(f".{tar.name}.*.partial"):
            left.unlink(missing_ok=True)
        made = _make(artifact, tar)
        written = json.dumps(
            {"sha256": made.sha256, "size": made.size, "tree": artifact.tree.digest}
        )
        _write_atomically(record, written.encode())
        return made


def _make(artifact: Artifact, tar: Path) -> PlainCopy:
    """Decompress the archive into `tar`, checked against the record on the way."""
    assert artifact.tree is not None
    tar.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=tar.parent, prefix=f".{tar.name}.", suffix=".partial")
    try:
        with (
            os.fdopen(fd, "wb") as out,
            artifact.located.open("rb") as raw,
            lzma.LZMAFile(packed := Hashing(raw)) as unpacked,  # type: ignore[arg-type]
        ):
            # The archive's bytes are hashed as read (`packed`, as pinned); the tar that
            # comes out of xz is hashed and written out while its tree is digested.
            plain = Hashing(unpacked, sink=out)
            try:
                tree = digest_of_archive(plain, PLAIN, algorithm_of(artifact.tree.digest))
            except (AddonError, OSError, EOFError, ValueError) as exc:
                raise _refused(artifact, f"it cannot be read: {exc}") from None
            while packed.read(1 << 20):
                pass
            out.flush()
            os.fsync(out.fileno())
        if packed.digest.hexdigest() != artifact.sha256:
            raise _refused(artifact, f"its SHA-256 is {packed.digest.hexdigest()}")
        if tree.digest != artifact.tree.digest:
            raise _refused(artifact, f"it unpacks to the tree {tree.digest}")
        os.replace(temporary, tar)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    log.info("decompressed %s for engines on this host: %s", artifact.name, tar)
    return PlainCopy(tar, plain.digest.hexdigest(), plain.size)


class Hashing:
    """A read-only stream that hashes (SHA-256) and counts what is read through it, and
    copies it to `sink` if one is given."""

    def __init__(self, raw: Readable, sink: IO[bytes] | None = None) -> None:
        self.raw = raw
        self.sink = sink
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1, /) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        self.size += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return data


def _refused(artifact: Artifact, why: str) -> SandboxInjectionError:
    return SandboxInjectionError(
        f"{artifact.name} at {artifact.located} is not the pinned add-on: {why}",
        remedy="Fetch or build it again (tools fetch --with-browser, tools build --with-browser).",
    )


def _write_atomically(path: Path, data: bytes) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def forget_if_changed(copy: PlainCopy) -> bool:
    """Drop `copy` if it no longer has the SHA-256 it was made with (changed on the host
    since; a sandbox's install from it failed): the next call makes it again from the
    pinned archive. Whether it was dropped."""
    try:
        same = sha256_of(copy.path) == copy.sha256
    except OSError:
        same = False
    if not same:
        for path in (copy.path, copy.path.with_suffix(".json")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        log.warning("dropped %s: it changed since it was made from its pinned archive", copy.path)
    return not same
