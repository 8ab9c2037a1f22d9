"""What an artifact is, defined once: its record, its name, whether bytes on disk are it,
and how every file of ours is written (whole or not at all).

One record serves every stage: `tools build` writes it into dist/build.json, the
manifest lists it with the URLs it was published to, the injector holds it with the
local path it found and where that came from. Bytes are trusted by size and SHA-256
only (`Artifact.matches`), never by name. Digests of files that are provably unchanged
(same size, inode, mtime and ctime: `touch -d` can fake an mtime, not a ctime) come
from a small cache beside them, so re-checking dist/ costs nothing.

Standard library only, and imported by build, validate, release, fetch and the
injector alike; it imports nothing of theirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from sandbox_tools._version import __version__
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.addons import ALGORITHMS, TREE_DIGEST, TreeDigest

BUILD_RECORD_FILE = "build.json"  # dist/build.json: what `tools build` made
RECORD_SCHEMA = 1
DIGEST_CACHE = ".sandbox-tools-digests.json"


class TextEnum(str, enum.Enum):
    """An enum that reads as its value in f-strings and str() on every Python we support
    (3.11 changed a str mixin's format() to the member's name)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class ArtifactFormat(TextEnum):
    PORTABLE = "portable"  # static launcher + onedir tree with its own glibc, unpacked once
    STATICX = "staticx"  # PyInstaller onefile + StaticX: unpacks itself on every start
    TAR_XZ = "tar.xz"  # a tree as tar + xz: the standard library (tarfile, lzma) unpacks it

    @property
    def suffix(self) -> str:
        return {"portable": "", "staticx": ".staticx", "tar.xz": ".tar.xz"}[self.value]


RUNTIME_FORMATS = (ArtifactFormat.PORTABLE, ArtifactFormat.STATICX)


class ArtifactKind(TextEnum):
    """What an artifact is for: the runtime itself, or an optional add-on beside it."""

    RUNTIME = "runtime"  # the executable injected into every sandbox
    BROWSER = "browser"  # headless Chromium with its own glibc, fonts and licences
    DESKTOP = "desktop"  # an X server, input, a window manager and a terminal, likewise


class Provenance(TextEnum):
    """Where the injector found an artifact's bytes (its order of preference)."""

    BUNDLED = "bundled"  # inside the installed package (wheel installs)
    CACHE = "cache"  # the artifact cache, filled by `tools fetch`
    FETCHED = "fetched"  # downloaded just now from the manifest's mirrors
    DIST = "dist"  # the checkout's dist/, its build id matching the sources
    BUILT = "built"  # built just now from the checkout


def artifact_name(arch: Arch, fmt: ArtifactFormat, version: str = __version__) -> str:
    return f"sandbox-tools-{version}-linux-{arch.value}{fmt.suffix}"


def addon_artifact_name(kind: ArtifactKind, arch: Arch, version: str = __version__) -> str:
    return f"sandbox-tools-{kind.value}-{version}-linux-{arch.value}{ArtifactFormat.TAR_XZ.suffix}"


def browser_artifact_name(arch: Arch, version: str = __version__) -> str:
    return addon_artifact_name(ArtifactKind.BROWSER, arch, version)


# -- writing files -----------------------------------------------------------------------


@contextlib.contextmanager
def atomic_output(path: Path, mode: int = 0o644) -> Iterator[IO[bytes]]:
    """A file that appears at `path` complete, or not at all.

    Written beside it under a temporary name, flushed to disk, then renamed over `path`
    (and the directory flushed, so the rename survives a crash). On any error, or if the
    block raises, the temporary file is removed and `path` is left as it was.
    """
    # A unique name: two writers of one path (threads, coroutines) never share it.
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        place(partial, path, mode)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def place(partial: Path, path: Path, mode: int = 0o644) -> None:
    """Move a finished file into place durably: its bytes on disk, then the rename."""
    with partial.open("rb") as handle:
        os.fsync(handle.fileno())
    partial.chmod(mode)
    partial.replace(path)
    with contextlib.suppress(OSError):  # not every file system lets a directory be synced
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def atomic_write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    with atomic_output(path, mode) as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


# -- digests -----------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _load_digests(directory: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads((directory / DIGEST_CACHE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store_digests(directory: Path, cache: dict[str, dict[str, str]]) -> None:
    # A cache that cannot be written only costs a re-hash next time.
    with contextlib.suppress(OSError):
        atomic_write(directory / DIGEST_CACHE, json.dumps(cache, indent=1, sort_keys=True))


def file_digest(path: Path) -> str | None:
    """SHA-256 of a regular file, from the cache when the file is provably unchanged."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    key = _stat_key(st)
    cache = _load_digests(path.parent)
    entry = cache.get(path.name)
    if isinstance(entry, dict) and entry.get("stat") == key and "sha256" in entry:
        return entry["sha256"]
    digest = sha256_of(path)
    if _stat_key(path.stat()) == key:  # not modified while we hashed it
        cache[path.name] = {"stat": key, "sha256": digest}
        _store_digests(path.parent, cache)
    return digest


def remember_digest(path: Path, digest: str) -> None:
    """Record a digest just computed elsewhere (the bytes before their rename into place)."""
    cache = _load_digests(path.parent)
    cache[path.name] = {"stat": _stat_key(path.stat()), "sha256": digest}
    _store_digests(path.parent, cache)


# -- the record --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """One artifact: exactly one per package version and platform.

    `urls` are the mirrors it was published to (manifest); `path` and `provenance` say
    where this process found bytes that match it (injector, release); both stay empty
    for the bare record.
    """

    name: str
    arch: Arch
    format: ArtifactFormat
    size: int
    sha256: str
    build_id: str
    tool_versions: Mapping[str, str] = field(default_factory=dict)
    kind: ArtifactKind = ArtifactKind.RUNTIME
    # An add-on's: what its archive unpacks to, computed once by `tools build` and checked
    # against the archive by `tools validate`, so no host computes it at eval time. The
    # runtime checks the unpacked tree against it on every install.
    tree: TreeDigest | None = None
    urls: tuple[str, ...] = ()
    path: Path | None = None
    provenance: Provenance | None = None

    @property
    def platform(self) -> str:
        return self.arch.platform

    def matches(self, path: Path, *, cache: bool = True) -> bool:
        """Whether `path` holds exactly these bytes (size first: cheap refusals stay cheap).

        `cache=False` hashes in full and writes nothing beside the file (an installed
        package's directory is not ours to write in).
        """
        try:
            if not path.is_file() or path.stat().st_size != self.size:
                return False
        except OSError:
            return False
        return (file_digest(path) if cache else sha256_of(path)) == self.sha256

    def found_at(
        self, path: Path, provenance: Provenance, *, cache: bool = True
    ) -> Artifact | None:
        """This artifact located at `path`, if the bytes there are it; else None."""
        if not self.matches(path, cache=cache):
            return None
        return replace(self, path=path, provenance=provenance)

    @property
    def located(self) -> Path:
        """The local path; only for artifacts `found_at` one (a bug otherwise)."""
        if self.path is None:
            raise ValueError(f"{self.name} has not been located on this machine")
        return self.path

    def to_json(self, *, urls: bool = False) -> dict[str, Any]:
        """The record as dist/build.json holds it; with `urls`, as the manifest does."""
        document: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "format": self.format.value,
            "size": self.size,
            "sha256": self.sha256,
            "build_id": self.build_id,
        }
        if self.kind is not ArtifactKind.RUNTIME:  # absent means the runtime (older records)
            document["kind"] = self.kind.value
        if self.tree is not None:
            document["tree"] = dataclasses.asdict(self.tree)
        if urls:
            document["urls"] = list(self.urls)
        else:
            document["tool_versions"] = dict(self.tool_versions)
        return document

    @classmethod
    def from_json(cls, data: Any, where: str = "artifact") -> Artifact:
        """A record from build.json or a manifest; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a JSON object")

        def required(name: str) -> Any:
            if name not in data:
                raise ValueError(f"{where} has no {name!r}")
            return data[name]

        try:
            arch = Arch.parse(str(required("platform")).removeprefix("linux/"))
            fmt = ArtifactFormat(str(required("format")))
            kind = ArtifactKind(str(data.get("kind", ArtifactKind.RUNTIME.value)))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        tool_versions = data.get("tool_versions") or {}
        urls = data.get("urls") or []
        if not isinstance(tool_versions, dict) or not isinstance(urls, list):
            raise ValueError(f"{where}: 'tool_versions' must be an object, 'urls' a list")
        return cls(
            name=str(required("name")),
            arch=arch,
            format=fmt,
            size=int(required("size")),
            sha256=str(required("sha256")),
            build_id=str(required("build_id")),
            tool_versions={str(k): str(v) for k, v in tool_versions.items()},
            kind=kind,
            tree=_tree_of(data.get("tree"), where),
            urls=tuple(str(u) for u in urls),
        )


def _tree_of(data: Any, where: str) -> TreeDigest | None:
    """An add-on record's tree digest, or None when it has none; ValueError if malformed."""
    if data is None:
        return None
    digest = data.get("digest") if isinstance(data, dict) else None
    size = data.get("size") if isinstance(data, dict) else None
    entries = data.get("entries") if isinstance(data, dict) else None
    if (
        not isinstance(digest, str)
        or not TREE_DIGEST.fullmatch(digest)
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (size, entries)
        )
    ):
        raise ValueError(
            f"{where}: 'tree' must be {{digest: <{'|'.join(ALGORITHMS)}>:<64 hex>, size, entries}}"
        )
    assert isinstance(size, int) and isinstance(entries, int)
    return TreeDigest(digest, size, entries)


def read_build_records(directory: Path) -> list[Artifact]:
    """The records of dist/build.json (none if there is no such file)."""
    path = directory / BUILD_RECORD_FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [
        Artifact.from_json(item, f"{path} artifact {n}")
        for n, item in enumerate(data.get("artifacts", []), 1)
    ]


def write_build_records(directory: Path, records: list[Artifact]) -> Path:
    """Replace the records of the same platform and format; keep the others.

    The add-ons are all tar.xz: their kind tells them apart."""
    merged = {(r.platform, r.format.value, r.kind.value): r for r in read_build_records(directory)}
    merged.update({(r.platform, r.format.value, r.kind.value): r for r in records})
    document = {
        "schema": RECORD_SCHEMA,
        "version": __version__,
        "artifacts": [merged[key].to_json() for key in sorted(merged)],
    }
    path = directory / BUILD_RECORD_FILE
    atomic_write(path, json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path
