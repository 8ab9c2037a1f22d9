"""Add-ons beside the runtime (the browser): unpacked, checked and found in the sandbox.

An add-on is a tree shipped as tar + xz. The host streams the archive into
`addon-install`, which the installer (root, or the runtime's own user) runs as a fixed
command: the tree is unpacked into a private staging directory beside its place, the
archive's SHA-256 and the unpacked tree's digest are both compared with what the host
pinned, and only then is the tree renamed into place. Nothing of it runs before that.

`addon-check` is the reuse check: it walks the tree in place and compares its digest,
and checks that every entry belongs to root or the installer and that nobody else can
write to it. A tree that an image planted beside a genuine runtime therefore fails it,
exactly as a planted runtime fails the runtime's own check (THREAT_MODEL.md, rule 2).

The tree digest is one definition for both sides: the host computes it from the archive
it pins (`digest_of_archive`), the sandbox from the directory (`digest_of_tree`). Each
entry contributes its path, kind, permission bits and content (or link target), sorted
by path, so a file that was changed, added, removed or made writable changes it.

Standard library only, as the whole runtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import os
import posixpath
import secrets
import shutil
import stat
import sys
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, BinaryIO

# What unpacking needs beyond the tree itself: file system blocks and metadata.
SPACE_MARGIN = 0.05
CHUNK = 1 << 20
# The permission bits an unpacked entry may have: no setuid, setgid or sticky bit, and
# nobody but the owner may write (a tree only root or the installer may change).
ALLOWED_BITS = 0o755


class AddonError(Exception):
    """The add-on cannot be installed or used; the message says why and what to do."""


@dataclass(frozen=True)
class TreeDigest:
    digest: str
    size: int  # bytes of file content
    entries: int


def _entry(path: str, kind: str, mode: int, payload: str) -> bytes:
    return f"{kind} {mode:04o} {path}\0{payload}\n".encode("utf-8", "surrogateescape")


def _combine(lines: Iterable[tuple[str, bytes]], size: int) -> TreeDigest:
    digest = hashlib.sha256()
    count = 0
    for _, line in sorted(lines):
        digest.update(line)
        count += 1
    return TreeDigest("sha256:" + digest.hexdigest(), size, count)


def _hash_stream(handle: IO[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def member_path(name: str) -> str:
    """An archive member's path, refused unless it is relative and plain: no empty, "."
    or ".." component, no leading "/", no NUL (the archive is checked as hostile input
    even though the host pinned it: a digest says which bytes, not that they are safe)."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\0" in name:
        raise AddonError(f"the archive holds an entry with an unsafe name: {name!r}")
    if any(part in ("", ".", "..") for part in parts):
        raise AddonError(f"the archive holds an entry with an unsafe name: {name!r}")
    return name


def link_target(path: str, target: str) -> str:
    """A symlink's target, refused unless relative and inside the tree."""
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
        raise AddonError(f"the archive's link {path!r} points outside the tree: {target!r}")
    return target


def digest_of_archive(handle: BinaryIO) -> TreeDigest:
    """The digest of the tree an archive unpacks to (the host's side; nothing is written)."""
    lines: list[tuple[str, bytes]] = []
    size = 0
    with lzma.open(handle) as plain, tarfile.open(fileobj=plain, mode="r|") as tar:
        for member in tar:
            path = member_path(member.name.rstrip("/"))
            mode = member.mode & ALLOWED_BITS
            if member.isdir():
                lines.append((path, _entry(path, "d", mode, "")))
            elif member.isreg():
                extracted = tar.extractfile(member)
                assert extracted is not None
                content, length = _hash_stream(extracted)
                size += length
                lines.append((path, _entry(path, "f", mode, content)))
            elif member.issym():
                lines.append((path, _entry(path, "l", 0, link_target(path, member.linkname))))
            else:
                raise AddonError(
                    f"the archive holds {path!r}, which is not a file, directory or link"
                )
    return _combine(lines, size)


def digest_of_tree(root: str, owners: frozenset[int]) -> TreeDigest:
    """The digest of the tree at `root` (the sandbox's side), walked without following
    links. Raises AddonError if an entry belongs to anyone but `owners` or has bits
    beyond ALLOWED_BITS (then someone else could change it, or it could gain rights)."""
    lines: list[tuple[str, bytes]] = []
    size = 0
    top = os.lstat(root)
    _check_entry(root, top, owners)
    if not stat.S_ISDIR(top.st_mode):
        raise AddonError(f"{root} is not a directory")
    pending = [""]
    while pending:
        relative = pending.pop()
        directory = os.path.join(root, relative) if relative else root
        with os.scandir(directory) as entries:
            for entry in entries:
                path = f"{relative}/{entry.name}" if relative else entry.name
                info = entry.stat(follow_symlinks=False)
                _check_entry(entry.path, info, owners)
                mode = stat.S_IMODE(info.st_mode)
                if stat.S_ISDIR(info.st_mode):
                    lines.append((path, _entry(path, "d", mode, "")))
                    pending.append(path)
                elif stat.S_ISREG(info.st_mode):
                    with open(entry.path, "rb", opener=_no_follow) as handle:
                        content, length = _hash_stream(handle)
                    size += length
                    lines.append((path, _entry(path, "f", mode, content)))
                elif stat.S_ISLNK(info.st_mode):
                    lines.append((path, _entry(path, "l", 0, os.readlink(entry.path))))
                else:
                    raise AddonError(f"{entry.path} is not a file, directory or link")
    return _combine(lines, size)


def _not_plain(path: str) -> AddonError:
    return AddonError(f"the archive holds {path!r}, which is not a file, directory or link")


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _check_entry(path: str, info: os.stat_result, owners: frozenset[int]) -> None:
    if info.st_uid not in owners:
        raise AddonError(f"{path} belongs to uid {info.st_uid}, not to the installer")
    if not stat.S_ISLNK(info.st_mode) and stat.S_IMODE(info.st_mode) & ~ALLOWED_BITS:
        raise AddonError(
            f"{path} has mode {stat.S_IMODE(info.st_mode):04o}: others could change it"
        )


def _owners() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def free_bytes(directory: str) -> int:
    """What an unprivileged writer may still use in `directory`'s file system."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize


def needed_bytes(tree_size: int) -> int:
    return int(tree_size * (1 + SPACE_MARGIN)) + (8 << 20)


def check(dest: str, digest: str) -> dict[str, object]:
    """Whether the add-on at `dest` is the pinned one: "ok", "missing" or "different"
    (with why), and the free space beside it, so that the host can refuse early."""
    started = time.monotonic()
    parent = os.path.dirname(dest.rstrip("/")) or "/"
    answer: dict[str, object] = {"free_bytes": free_bytes(parent)}
    try:
        found = digest_of_tree(dest, _owners())
    except FileNotFoundError:
        answer.update(state="missing")
    except (AddonError, OSError) as exc:
        answer.update(state="different", why=str(exc))
    else:
        if found.digest == digest:
            answer.update(state="ok")
        else:
            answer.update(state="different", why=f"its tree digest is {found.digest}")
    answer["seconds"] = round(time.monotonic() - started, 3)
    return answer


class _Hashing:
    """A read-only stream that hashes and counts what is read through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def _unpack(source: _Hashing, staging: str) -> None:
    """Unpack the tar.xz stream into `staging` (a fresh private directory), creating
    every entry relative to it and never through a link: a member's parents must be
    directories this archive made."""
    kinds: dict[str, str] = {"": "d"}
    directories: list[tuple[str, int]] = []
    # lzma.open reads the archive's concatenated .xz streams as one (tarfile's "r|xz"
    # stops after the first).
    with lzma.open(source) as plain, tarfile.open(fileobj=plain, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            path = member_path(member.name.rstrip("/"))
            parent = posixpath.dirname(path)
            if kinds.get(parent) != "d":
                raise AddonError(f"the archive holds {path!r} before its directory")
            if path in kinds:
                raise AddonError(f"the archive holds {path!r} twice")
            target = os.path.join(staging, path)
            if member.isdir():
                os.mkdir(target, 0o700)
                directories.append((target, member.mode & ALLOWED_BITS))
                kinds[path] = "d"
            elif member.isreg():
                extracted = tar.extractfile(member)
                assert extracted is not None
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                fd = os.open(target, flags, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(extracted, out, CHUNK)
                    os.fchmod(out.fileno(), member.mode & ALLOWED_BITS)
                kinds[path] = "f"
            elif member.issym():
                os.symlink(link_target(path, member.linkname), target)
                kinds[path] = "l"
            else:
                raise AddonError(
                    f"the archive holds {path!r}, which is not a file, directory or link"
                )
    source.drain()  # the stream's end (padding, the xz index) counts for the SHA-256 too
    for directory, mode in reversed(directories):
        os.chmod(directory, mode)


def install(
    dest: str, sha256: str, digest: str, tree_size: int, archive: BinaryIO
) -> dict[str, object]:
    """Unpack the archive read from `archive` into `dest`, checked before it is in place.

    The staging directory sits beside `dest` (one file system, so the final rename is
    atomic) under a random name. If `dest` already holds the pinned tree (a racing
    installer finished first) the new copy is dropped; if it holds anything else, that
    is moved aside and removed."""
    started = time.monotonic()
    dest = dest.rstrip("/")
    parent = os.path.dirname(dest) or "/"
    available, needed = free_bytes(parent), needed_bytes(tree_size)
    if available < needed:
        raise AddonError(
            f"the add-on needs {needed >> 20} MiB free in {parent}; {available >> 20} MiB are"
        )
    staging = os.path.join(parent, f".{os.path.basename(dest)}-{secrets.token_hex(6)}.partial")
    os.mkdir(staging, 0o700)
    try:
        source = _Hashing(archive)
        try:
            _unpack(source, staging)
        except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
            raise AddonError(f"the archive cannot be unpacked: {exc}") from None
        if source.digest.hexdigest() != sha256:
            raise AddonError(
                f"the archive received has SHA-256 {source.digest.hexdigest()} ({source.size} "
                f"bytes), not the pinned {sha256}"
            )
        os.chmod(staging, 0o755)
        found = digest_of_tree(staging, _owners())
        if found.digest != digest:
            raise AddonError(
                f"the unpacked tree's digest is {found.digest}, not the pinned {digest}"
            )
        state = _place(staging, dest, digest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "state": state,
        "bytes": source.size,
        "tree_bytes": found.size,
        "seconds": round(time.monotonic() - started, 3),
    }


def _place(staging: str, dest: str, digest: str) -> str:
    with contextlib.suppress(FileNotFoundError):
        if check(dest, digest)["state"] == "ok":
            shutil.rmtree(staging)
            return "present"
        aside = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}-{secrets.token_hex(6)}.old"
        os.rename(dest, aside)
        # rmtree does not follow links: whatever was there is removed, nothing outside it.
        shutil.rmtree(aside, ignore_errors=True)
    os.rename(staging, dest)
    return "installed"


def main(argv: list[str]) -> int:
    """`addon-check DEST DIGEST` and `addon-install DEST SHA256 DIGEST TREE_BYTES` (the
    archive on stdin): one JSON line on stdout; a failure is one sentence on stderr and
    exit code 1."""
    try:
        if len(argv) == 3 and argv[0] == "check":
            answer = check(argv[1], argv[2])
        elif len(argv) == 5 and argv[0] == "install" and argv[4].isdigit():
            answer = install(argv[1], argv[2], argv[3], int(argv[4]), sys.stdin.buffer)
        else:
            print(
                "usage: addon-check DEST DIGEST | addon-install DEST SHA256 DIGEST TREE_BYTES",
                file=sys.stderr,
            )
            return 2
    except (AddonError, OSError) as exc:
        print(f"sandbox-tools: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, sort_keys=True))
    return 0
