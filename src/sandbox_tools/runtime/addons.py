"""Add-ons beside the runtime (the browser): unpacked, checked and found in the sandbox.

An add-on is a tree shipped as tar + xz. The host streams the archive into
`addon-install`, which the installer (root, or the runtime's own user) runs as a fixed
command: the tree is unpacked into a private staging directory beside its place, its
digest is compared with the one the host pinned, and only then is the tree renamed into
place. Nothing of it runs before that. Where bytes into the sandbox are cheaper than
decompressing them there (an engine on the host), the host streams the plain tar
instead (FORMATS): the same tree, the same check.

`addon-check` is the reuse check: it walks the tree in place and compares its digest,
and checks that every entry belongs to root or the installer and that nobody else can
write to it. A tree that an image planted beside a genuine runtime therefore fails it,
exactly as a planted runtime fails the runtime's own check (THREAT_MODEL.md, rule 2).

A later check of a tree the host saw checked need not hash it again: a full check (and
`addon-install`) also answers the tree's *stat signature* (`signature_of`), a digest of
what `lstat` says of every entry: path, kind, mode, owner, size, inode, device, mtime
and ctime. The host keeps it in its own memory (never in the sandbox) and passes it to
the next `addon-check` of that sandbox and directory, which then only stats the entries
(the same owner and mode rules) and answers "ok" when the signature is the same, else
hashes the tree as before. A write, chmod, chown, rename or utimensat moves ctime to
the kernel's clock at that moment: no call sets ctime, and only CAP_SYS_TIME (which
engines do not give a container) sets the clock. So a tree whose signature is the one
taken when its content was checked has not been changed that way since, provided no
change could share a clock tick with the recorded ctimes: a signature is given only for
a tree whose every ctime is older than the moment its first stat walk began by more
than the file system's timestamp granularity can hide (`_settled_at`). THREAT_MODEL.md,
"Delivering the add-on", says what this does not see (a shared writable mapping).

The tree digest is one definition for both sides: the host computes it from the archive
it pins (`digest_of_archive`), the sandbox from the directory (`digest_of_tree`). Each
entry contributes its path, kind, permission bits and content (or link target), sorted
by path, so a file that was changed, added, removed or made writable changes it. Its
prefix names the hash (ALGORITHMS): BLAKE2b-256 for what `tools build` makes now, since
the runtime carries no OpenSSL and Python's own SHA-256 hashed the browser's ~300 MiB in
about 1 s where BLAKE2b takes 0.4 s; records made with SHA-256 are still checked with it.

Standard library only, as the whole runtime.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import lzma
import os
import posixpath
import queue
import re
import secrets
import stat
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, BinaryIO, Protocol

# What unpacking needs beyond the tree itself: file system blocks and metadata.
SPACE_MARGIN = 0.05
CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE
BUFFERS = 8  # the stream read ahead by at most this many CHUNKs
# The permission bits an unpacked entry may have: no setuid, setgid or sticky bit, and
# nobody but the owner may write (a tree only root or the installer may change).
ALLOWED_BITS = 0o755
# How `addon-install` may receive an add-on: the pinned archive as built, or its tar
# uncompressed (the host decompressed it: the tree digest is the pin either way).
XZ, PLAIN = "tar.xz", "tar"
FORMATS = (XZ, PLAIN)
# A tree digest's hash, by the name it is prefixed with; 32-byte digests all.
ALGORITHMS: dict[str, Callable[[], Hasher]] = {
    "blake2b": lambda: hashlib.blake2b(digest_size=32),
    "sha256": hashlib.sha256,
}
TREE_ALGORITHM = "blake2b"  # what new records are made with
TREE_DIGEST = re.compile(rf"(?:{'|'.join(ALGORITHMS)}):[0-9a-f]{{64}}")
# A tree's stat signature (`signature_of`): BLAKE2b-256 over every entry's lstat.
SIGNATURE = re.compile(r"stat:[0-9a-f]{64}")
SIGNATURE_HEADER = "sandbox-tools stat signature 1"  # changes with the line's format
# How much older than a stat walk every ctime must be for the walk to give a signature.
# A change's ctime is the kernel's coarse clock, at most a tick (10 ms at the lowest HZ,
# 100) behind the real time, so a change after the walk began cannot share a recorded
# ctime older than that. A ctime in whole milliseconds is taken for a file system that
# keeps no finer time (whole seconds; FAT's two): it must be older by more than that.
FINE_AGE_NS = 50_000_000
COARSE_AGE_NS = 3_000_000_000
# How long a check or an install waits for a tree changed just now (its own unpacking)
# to become old enough for a signature; longer, and it gives none (the next check
# hashes the tree and gives one then).
SIGNATURE_PATIENCE_NS = 250_000_000


class AddonError(Exception):
    """The add-on cannot be installed or used; the message says why and what to do."""


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class TreeDigest:
    digest: str
    size: int  # bytes of file content
    entries: int


def _entry(path: str, kind: str, mode: int, payload: str) -> bytes:
    return f"{kind} {mode:04o} {path}\0{payload}\n".encode("utf-8", "surrogateescape")


def algorithm_of(digest: str) -> str:
    """The hash a tree digest was made with (its prefix); AddonError if unknown."""
    if TREE_DIGEST.fullmatch(digest) is None:
        raise AddonError(
            f"{digest[:80]!r} is not a tree digest ({' or '.join(ALGORITHMS)}:<64 hex>)"
        )
    return digest.partition(":")[0]


def _combine(lines: Iterable[tuple[str, bytes]], size: int, algorithm: str) -> TreeDigest:
    digest = ALGORITHMS[algorithm]()
    count = 0
    for _, line in sorted(lines):
        digest.update(line)
        count += 1
    return TreeDigest(f"{algorithm}:{digest.hexdigest()}", size, count)


def _hash_stream(
    handle: IO[bytes], algorithm: str, sink: IO[bytes] | None = None
) -> tuple[str, int]:
    """The hash and length of what `handle` holds, copied to `sink` on the way."""
    digest = ALGORITHMS[algorithm]()
    size = 0
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
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


def _known_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise AddonError(f"an add-on comes as {' or '.join(FORMATS)}, not {fmt!r}")


class _Blocks:
    """A tar stream as views into a few fixed buffers that a thread fills ahead.

    tarfile's own stream reader copies every byte through four fresh allocations on its
    way to the file (its buffer, the member's reader, the chunk, the read-ahead): for the
    browser's 300 MiB that was 270,000 page faults, and the sandbox's unpacking took three
    times what the engine takes to carry the bytes. Here the source reads straight into
    one of BUFFERS buffers of CHUNK bytes (a thread of its own: the reads release the GIL
    and overlap with hashing and writing what came before), the hash and the write take
    views of them, and a buffer goes back to the thread once its bytes are used. Every
    buffer but the last is filled whole, and CHUNK is a multiple of tar's 512-byte block,
    so a header never spans two buffers."""

    def __init__(self, source: Readable) -> None:
        self._buffers = [bytearray(CHUNK) for _ in range(BUFFERS)]
        self._free: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._full: queue.SimpleQueue[tuple[int, int] | BaseException] = queue.SimpleQueue()
        for index in range(BUFFERS):
            self._free.put(index)
        self._current: int | None = None
        self._position = self._end = 0
        self._ended = False
        threading.Thread(target=self._fill, args=(source,), daemon=True).start()

    def _fill(self, source: Readable) -> None:
        readinto = getattr(source, "readinto", None)
        try:
            while (index := self._free.get()) is not None:
                view, count = memoryview(self._buffers[index]), 0
                while count < CHUNK:
                    if readinto is not None:
                        got = readinto(view[count:])
                    else:  # a reader without readinto (the host's hashing stream)
                        data = source.read(CHUNK - count)
                        got = len(data)
                        view[count : count + got] = data
                    if not got:
                        break
                    count += got
                self._full.put((index, count))
                if count < CHUNK:
                    return
        except BaseException as exc:  # handed to the reader, raised there
            self._full.put(exc)

    def view(self, most: int) -> memoryview:
        """Up to `most` (at least one) of the next bytes, valid until the next call;
        EOFError where the stream has ended."""
        if self._position == self._end:
            if self._current is not None:
                self._free.put(self._current)
                self._current = None
            if self._ended:
                raise EOFError("the archive ends in the middle of an entry")
            item = self._full.get()
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            self._current, self._end = item
            self._position = 0
            self._ended = self._end < CHUNK
            if self._end == 0:
                raise EOFError("the archive ends in the middle of an entry")
        taken = min(most, self._end - self._position)
        start = self._position
        self._position += taken
        assert self._current is not None
        return memoryview(self._buffers[self._current])[start : start + taken]

    def exactly(self, size: int) -> bytes:
        """The next `size` bytes, copied (headers and their records: small)."""
        parts = bytearray()
        while len(parts) < size:
            parts += self.view(size - len(parts))
        return bytes(parts)

    def content(self, size: int) -> Iterator[memoryview]:
        """A member's `size` bytes as views, then its padding to the next block."""
        left = size
        while left:
            piece = self.view(left)
            left -= len(piece)
            yield piece
        self.skip(-size % BLOCK)

    def skip(self, size: int) -> None:
        while size:
            size -= len(self.view(size))

    def drain(self) -> None:
        """Read to the end: a hash of the source then covers every byte (an xz stream's
        index, the tar's closing blocks)."""
        with contextlib.suppress(EOFError):
            while True:
                self.view(CHUNK)

    def close(self) -> None:
        """Let the filling thread end (it may wait for a free buffer)."""
        self._free.put(None)


@dataclass(frozen=True)
class _Member:
    path: str
    kind: str  # "d", "f" or "l"
    mode: int  # the permission bits kept (ALLOWED_BITS)
    size: int  # of a file's content
    target: str  # of a link


# Entries that only carry the next member's long name or link target (POSIX pax, GNU).
_NAME_RECORDS = (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
# Files: tarfile's isreg() also takes GNU sparse members, whose bytes are a map.
_FILES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
# The most a name record may hold: no real path needs more.
MAX_NAME_RECORD = 1 << 16


def _pax_names(data: bytes, path: str) -> dict[str, str]:
    """The `path` and `linkpath` of a pax extended header ("LENGTH KEY=VALUE\n" records);
    other keys are ignored, as they do not change the tree (owners, times)."""
    found: dict[str, str] = {}
    malformed = AddonError(f"the archive's pax header before {path!r} is malformed")
    position = 0
    while position < len(data) and data[position] != 0:
        length_text, space, _ = data[position : position + 20].partition(b" ")
        if not space or not length_text.isdigit():
            raise malformed
        length = int(length_text)
        record = data[position : position + length]
        if length <= len(length_text) + 1 or len(record) < length or record[-1:] != b"\n":
            raise malformed
        key, equals, value = record[len(length_text) + 1 : -1].partition(b"=")
        if not equals:
            raise malformed
        if key in (b"path", b"linkpath"):
            found[key.decode()] = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            raise AddonError(f"the archive gives {path!r} its size in a pax header (8 GiB or more)")
        position += length
    return found


def _archive_members(blocks: _Blocks) -> Iterator[_Member]:
    """The members of the tar stream `blocks` holds, each checked as hostile input; the
    caller reads a file's content (`blocks.content`) before asking for the next."""
    names: dict[str, str] = {}
    while True:
        header = blocks.exactly(BLOCK)
        if not any(header):
            return  # the closing blocks (the rest is drained by the caller)
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise AddonError(f"the archive has a malformed header: {exc}") from None
        if info.type in _NAME_RECORDS:
            if info.size > MAX_NAME_RECORD:
                raise AddonError(f"the archive holds a name record of {info.size} bytes")
            data = blocks.exactly(info.size)
            blocks.skip(-info.size % BLOCK)
            if info.type == tarfile.XHDTYPE:
                names.update(_pax_names(data, info.name))
            else:
                key = "path" if info.type == tarfile.GNUTYPE_LONGNAME else "linkpath"
                names[key] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        name = names.get("path", info.name)
        linkname = names.get("linkpath", info.linkname)
        names = {}
        path = member_path(name.rstrip("/"))
        mode = info.mode & ALLOWED_BITS
        if info.isdir():
            yield _Member(path, "d", mode, 0, "")
        elif info.type in _FILES:
            yield _Member(path, "f", mode, info.size, "")
        elif info.issym():
            yield _Member(path, "l", 0, 0, link_target(path, linkname))
        else:
            raise _not_plain(path)


@contextlib.contextmanager
def _opened(handle: Readable, fmt: str) -> Iterator[_Blocks]:
    """The archive read from `handle` as a tar stream's blocks; read to its end when the
    caller is done, so a hash of `handle` covers every byte."""
    _known_format(fmt)
    with contextlib.ExitStack() as stack:
        plain: Readable = handle
        if fmt == XZ:
            # LZMAFile reads the archive's concatenated .xz streams as one.
            plain = stack.enter_context(lzma.LZMAFile(handle))  # type: ignore[arg-type]
        blocks = _Blocks(plain)
        try:
            yield blocks
            blocks.drain()
        finally:
            blocks.close()
        while handle.read(CHUNK):
            pass


def _hashed_content(blocks: _Blocks, size: int, algorithm: str, sink: int | None = None) -> str:
    """The hash of a member's `size` bytes, written to the file descriptor `sink` on the
    way if one is given."""
    digest = ALGORITHMS[algorithm]()
    for piece in blocks.content(size):
        digest.update(piece)
        while sink is not None and piece:
            piece = piece[os.write(sink, piece) :]
    return digest.hexdigest()


def digest_of_archive(
    handle: Readable, fmt: str = XZ, algorithm: str = TREE_ALGORITHM
) -> TreeDigest:
    """The digest of the tree an archive unpacks to (the host's side; nothing is written)."""
    lines: list[tuple[str, bytes]] = []
    size = 0
    with _opened(handle, fmt) as blocks:
        for member in _archive_members(blocks):
            payload = member.target
            if member.kind == "f":
                payload = _hashed_content(blocks, member.size, algorithm)
                size += member.size
            lines.append((member.path, _entry(member.path, member.kind, member.mode, payload)))
    return _combine(lines, size, algorithm)


def _walk(root: str, owners: frozenset[int]) -> Iterator[tuple[str, str, os.stat_result]]:
    """Every entry of the tree at `root` as (path relative to it, full path, lstat),
    the top directory first as "", without following links. Raises AddonError if an
    entry belongs to anyone but `owners`, has bits beyond ALLOWED_BITS (then someone
    else could change it, or it could gain rights) or is no file, directory or link."""
    top = os.lstat(root)
    _check_entry(root, top, owners)
    if not stat.S_ISDIR(top.st_mode):
        raise AddonError(f"{root} is not a directory")
    yield "", root, top
    pending = [""]
    while pending:
        relative = pending.pop()
        directory = os.path.join(root, relative) if relative else root
        with os.scandir(directory) as entries:
            for entry in entries:
                path = f"{relative}/{entry.name}" if relative else entry.name
                info = entry.stat(follow_symlinks=False)
                _check_entry(entry.path, info, owners)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(path)
                elif not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                    raise AddonError(f"{entry.path} is not a file, directory or link")
                yield path, entry.path, info


def digest_of_tree(
    root: str, owners: frozenset[int], algorithm: str = TREE_ALGORITHM
) -> TreeDigest:
    """The digest of the tree at `root` (the sandbox's side), walked without following
    links. Raises AddonError if an entry belongs to anyone but `owners` or has bits
    beyond ALLOWED_BITS (then someone else could change it, or it could gain rights)."""
    lines: list[tuple[str, bytes]] = []
    size = 0
    for path, full, info in _walk(root, owners):
        if not path:
            continue  # the top directory: its place, not part of the add-on
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            lines.append((path, _entry(path, "d", mode, "")))
        elif stat.S_ISREG(info.st_mode):
            with open(full, "rb", opener=_no_follow) as handle:
                content, length = _hash_stream(handle, algorithm)
            size += length
            lines.append((path, _entry(path, "f", mode, content)))
        else:
            lines.append((path, _entry(path, "l", 0, os.readlink(full))))
    return _combine(lines, size, algorithm)


@dataclass(frozen=True)
class EntryStat:
    """What `lstat` says of one entry of a tree, as far as a stat signature covers it."""

    path: str  # relative to the tree's top; "" for the top itself
    kind: str  # "d", "f" or "l"
    mode: int
    uid: int
    gid: int
    size: int
    inode: int
    device: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str, info: os.stat_result) -> EntryStat:
        kind = "d" if stat.S_ISDIR(info.st_mode) else "l" if stat.S_ISLNK(info.st_mode) else "f"
        return cls(
            path,
            kind,
            stat.S_IMODE(info.st_mode),
            info.st_uid,
            info.st_gid,
            info.st_size,
            info.st_ino,
            info.st_dev,
            info.st_mtime_ns,
            info.st_ctime_ns,
        )

    def line(self) -> bytes:
        fields = (self.mode, self.uid, self.gid, self.size, self.inode, self.device)
        numbers = " ".join(str(n) for n in (*fields, self.mtime_ns, self.ctime_ns))
        return f"{self.kind} {numbers} {self.path}\0".encode("utf-8", "surrogateescape")


def stat_entries(root: str, owners: frozenset[int]) -> list[EntryStat]:
    """Every entry of the tree at `root`, stat'ed and not read: the owner and mode rules
    of `digest_of_tree` (AddonError), no link followed, no file opened."""
    return [EntryStat.of(path, info) for path, _, info in _walk(root, owners)]


def signature_of(root: str, entries: Iterable[EntryStat]) -> str:
    """The stat signature of the tree at `root` (an absolute path) made of `entries`:
    BLAKE2b-256 over the format's name, `root`, and one line per entry sorted by path.

    Every field a change moves is in it: a file written in place moves its ctime (and
    mtime, and maybe size), one replaced has another inode and ctime, an entry added or
    removed adds or removes a line and moves its directory's mtime and ctime, a chmod or
    chown moves the mode or owner and the ctime. The path of the tree and its top
    directory's inode and device are in it too, so the signature of one directory (or
    of a copy of it, in another sandbox) never matches another."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(f"{SIGNATURE_HEADER}\n{root}\0".encode("utf-8", "surrogateescape"))
    for entry in sorted(entries, key=lambda e: e.path):
        digest.update(entry.line())
    return f"stat:{digest.hexdigest()}"


def signature_from(text: str) -> str:
    """A stat signature given on the command line, or AddonError naming its form."""
    if SIGNATURE.fullmatch(text) is None:
        raise AddonError(f"{text[:80]!r} is not a stat signature (stat:<64 hex>)")
    return text


def _settled_at(entries: Iterable[EntryStat]) -> int:
    """The time (ns since the epoch) after which a stat walk that begins then can be
    sure that any later change to these entries moves a ctime it recorded: every ctime
    plus the age its file system's granularity asks for (FINE_AGE_NS, COARSE_AGE_NS)."""
    return max(
        (e.ctime_ns + (COARSE_AGE_NS if e.ctime_ns % 1_000_000 == 0 else FINE_AGE_NS))
        for e in entries
    )


def settled_signature(root: str, owners: frozenset[int]) -> tuple[list[EntryStat], str | None]:
    """The entries of the tree at `root` and its stat signature, or None for the
    signature when a ctime is too recent for one (`_settled_at`): then this waits, at
    most SIGNATURE_PATIENCE_NS in all, and walks again."""
    give_up = time.time_ns() + SIGNATURE_PATIENCE_NS
    while True:
        began = time.time_ns()
        entries = stat_entries(root, owners)
        ready = _settled_at(entries)
        if ready < began:
            return entries, signature_of(root, entries)
        if ready > give_up:
            return entries, None
        time.sleep((ready - began) / 1e9)


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
    if stat.S_ISREG(info.st_mode) and _has_capabilities(path):
        # What a setuid bit would give, which the mode above refuses; neither the digest
        # nor lstat sees it (the tree's loader with cap_setuid ran a user's program as root).
        raise AddonError(f"{path} carries file capabilities")


def _has_capabilities(path: str) -> bool:
    try:
        os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise
    return True


def _owners() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def free_bytes(directory: str) -> int:
    """What an unprivileged writer may still use in `directory`'s file system."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize


def needed_bytes(tree_size: int) -> int:
    return int(tree_size * (1 + SPACE_MARGIN)) + (8 << 20)


def check(dest: str, digest: str, signature: str | None = None) -> dict[str, object]:
    """Whether the add-on at `dest` is the pinned one: "ok", "missing" or "different"
    (with why), and the free space beside it, so that the host can refuse early.

    With `signature` (the stat signature an earlier check or install of this tree gave
    the host), the entries are only stat'ed: the same signature is "ok" without a byte
    read (`method` "signature"); another one, and the tree is hashed as without it
    (`method` "hash"). A hashed tree that matches answers its `signature` (None when its
    ctimes are too recent for one, `settled_signature`): the stat walks before and after
    the hash must agree, so the content hashed is the content the signature describes."""
    started = time.monotonic()
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    answer: dict[str, object] = {"free_bytes": free_bytes(parent), "method": "hash"}
    algorithm = algorithm_of(digest)
    owners = _owners()
    try:
        if signature is not None and signature_of(dest, stat_entries(dest, owners)) == signature:
            answer.update(state="ok", method="signature", signature=signature)
        else:
            answer.update(_hashed(dest, digest, algorithm, owners))
    except FileNotFoundError:
        answer.update(state="missing")
    except (AddonError, OSError) as exc:
        answer.update(state="different", why=str(exc))
    answer["seconds"] = round(time.monotonic() - started, 3)
    return answer


def check_as_asked(
    directory: str | None, digest: str | None, signature: str | None
) -> dict[str, object] | None:
    """The check an add-on's info method (`browser_info`, `computer_info`) was asked to
    make first: None where none was asked; InvalidParams for a request that cannot be
    one. A tree whose signature moved is hashed, which takes a second: call it in a
    thread."""
    from sandbox_tools.runtime.jsonrpc import InvalidParams

    if directory is None and digest is None:
        if signature is not None:
            raise InvalidParams("addon_signature needs addon_dir and addon_digest")
        return None
    if directory is None or digest is None or not directory.startswith("/"):
        raise InvalidParams("addon_dir (an absolute path) and addon_digest go together")
    if not TREE_DIGEST.fullmatch(digest):
        raise InvalidParams(f"addon_digest is not a tree digest: {digest[:80]!r}")
    if signature is not None and not SIGNATURE.fullmatch(signature):
        raise InvalidParams(f"addon_signature is not a stat signature: {signature[:80]!r}")
    return check(directory, digest, signature)


def _hashed(dest: str, digest: str, algorithm: str, owners: frozenset[int]) -> dict[str, object]:
    """The full check of `check`: the tree hashed between two stat walks."""
    before, signature = settled_signature(dest, owners)
    found = digest_of_tree(dest, owners, algorithm)
    if found.digest != digest:
        return {"state": "different", "why": f"its tree digest is {found.digest}"}
    if signature_of(dest, stat_entries(dest, owners)) != signature_of(dest, before):
        return {"state": "different", "why": "it changed while it was checked"}
    return {"state": "ok", "signature": signature}


def _unpack(source: Readable, staging: str, fmt: str, algorithm: str) -> TreeDigest:
    """Unpack the archive stream into `staging` (a fresh private directory), creating
    every entry relative to it and never through a link: a member's parents must be
    directories this archive made. Returns the digest of the tree written, computed
    from the bytes as they are written: `staging` is private to the installer, so what
    it wrote is what is there, and the tree is not read a second time."""
    kinds: dict[str, str] = {"": "d"}
    directories: list[tuple[str, int]] = []
    lines: list[tuple[str, bytes]] = []
    size = 0
    with _opened(source, fmt) as blocks:
        for member in _archive_members(blocks):
            path = member.path
            if kinds.get(posixpath.dirname(path)) != "d":
                raise AddonError(f"the archive holds {path!r} before its directory")
            if path in kinds:
                raise AddonError(f"the archive holds {path!r} twice")
            target = os.path.join(staging, path)
            payload = member.target
            if member.kind == "d":
                os.mkdir(target, 0o700)
                directories.append((target, member.mode))
            elif member.kind == "f":
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(target, flags, 0o600)
                try:
                    payload = _hashed_content(blocks, member.size, algorithm, fd)
                    os.fchmod(fd, member.mode)
                finally:
                    os.close(fd)
                size += member.size
            else:
                os.symlink(member.target, target)
            kinds[path] = member.kind
            lines.append((path, _entry(path, member.kind, member.mode, payload)))
    for directory, mode in reversed(directories):
        os.chmod(directory, mode)
    return _combine(lines, size, algorithm)


def install(
    dest: str, digest: str, tree_size: int, archive: BinaryIO, fmt: str = XZ
) -> dict[str, object]:
    """Unpack the archive read from `archive` (a `fmt` of FORMATS) into `dest`, checked
    before it is in place against the pinned tree `digest`: every byte that lands in the
    tree is in it, with every path, kind and mode, so it is the pin for both formats
    (the archive's SHA-256 was checked where it was acquired).

    The staging directory sits beside `dest` (one file system, so the final rename is
    atomic) under a random name. If `dest` already holds the pinned tree (a racing
    installer finished first) the new copy is dropped; if it holds anything else, that
    is moved aside and removed."""
    started = time.monotonic()
    dest = dest.rstrip("/")
    parent = os.path.dirname(dest) or "/"
    algorithm = algorithm_of(digest)
    _known_format(fmt)  # before a byte is read
    available, needed = free_bytes(parent), needed_bytes(tree_size)
    if available < needed:
        raise AddonError(
            f"the add-on needs {needed >> 20} MiB free in {parent}; {available >> 20} MiB are"
        )
    staging = os.path.join(parent, f".{os.path.basename(dest)}-{secrets.token_hex(6)}.partial")
    os.mkdir(staging, 0o700)
    try:
        try:
            found = _unpack(archive, staging, fmt, algorithm)
        except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
            raise AddonError(f"the archive cannot be unpacked: {exc}") from None
        if found.digest != digest:
            raise AddonError(
                f"the unpacked tree's digest is {found.digest}, not the pinned {digest}"
            )
        os.chmod(staging, 0o755)
        state, signature = _place(staging, dest, digest)
    except BaseException:
        with contextlib.suppress(OSError):
            remove_tree(staging)
        raise
    return {
        "state": state,
        "tree_bytes": found.size,
        "signature": signature,
        "seconds": round(time.monotonic() - started, 3),
    }


def _replace(new: str, dest: str) -> None:
    """Rename `new` to `dest`, moving whatever is there aside and removing it first (in
    place where it cannot be moved: overlayfs refuses to rename a directory of an
    image's lower layer, EXDEV)."""
    try:
        os.rename(new, dest)
        return
    except OSError:
        if not os.path.lexists(dest):
            raise
    aside = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}-{secrets.token_hex(6)}.old"
    try:
        os.rename(dest, aside)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        aside = dest
    if aside != dest:
        os.rename(new, dest)
        with contextlib.suppress(OSError):  # a leftover nobody uses: never the install's end
            remove_tree(aside)
        return
    remove_tree(dest)
    os.rename(new, dest)


def remove_tree(top: str) -> None:
    """Remove `top` and what it holds, following no link, without recursion: the tree
    may be an image's, and `shutil.rmtree` gave up on one 1100 directories deep
    (Python's recursion limit), failing the install with a traceback."""
    if not os.path.isdir(top) or os.path.islink(top):
        os.unlink(top)
        return
    stack = [(top, False)]
    while stack:
        path, emptied = stack.pop()
        if emptied:
            os.rmdir(path)
            continue
        stack.append((path, True))
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, False))
                else:
                    os.unlink(entry.path)


def _place(staging: str, dest: str, digest: str) -> tuple[str, str | None]:
    """Put the checked tree in `staging` at `dest`: the state and the tree's stat
    signature. The tree in place is the one this install digested as it wrote it (the
    staging directory was the installer's alone, as `dest`'s directory is: root and the
    installer can change either), so its signature is taken without reading it again;
    this waits up to SIGNATURE_PATIENCE_NS for its ctimes to settle (`settled_signature`),
    and gives none when they do not or the walk fails."""
    present = check(dest, digest)
    if present["state"] == "ok":  # a racing installer finished first
        remove_tree(staging)
        signature = present.get("signature")
        return "present", signature if isinstance(signature, str) else None
    _replace(staging, dest)
    try:
        return "installed", settled_signature(os.path.abspath(dest), _owners())[1]
    except (AddonError, OSError):  # changed already: the next check hashes it
        return "installed", None


def main(argv: list[str]) -> int:
    """`addon-check DEST DIGEST [SIGNATURE]` and `addon-install DEST DIGEST TREE_BYTES
    FORMAT` (the archive on stdin, FORMAT one of FORMATS): one JSON line on stdout; a
    failure is one sentence on stderr and exit code 1."""
    try:
        if len(argv) in (3, 4) and argv[0] == "check":
            signature = signature_from(argv[3]) if len(argv) == 4 else None
            answer = check(argv[1], argv[2], signature)
        elif len(argv) == 5 and argv[0] == "install" and argv[3].isdigit():
            answer = install(argv[1], argv[2], int(argv[3]), sys.stdin.buffer, argv[4])
        else:
            print(
                "usage: addon-check DEST DIGEST [SIGNATURE] | addon-install DEST DIGEST "
                f"TREE_BYTES {'|'.join(FORMATS)}",
                file=sys.stderr,
            )
            return 2
    except (AddonError, OSError) as exc:
        print(f"sandbox-tools: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, sort_keys=True))
    return 0
