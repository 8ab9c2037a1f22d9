"""Re-verifying artifacts already on disk without re-hashing them on every use.

A file is trusted only while its size, inode, mtime and ctime are those recorded when its
SHA-256 was last computed. `touch -d` can fake an mtime but not a ctime, so any write,
rename over or metadata change forces a full re-hash. The cache lives next to the files;
when it cannot be written, verification still works, it just hashes every time.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from sandbox_tools.build_containers.records import sha256_of

DIGEST_CACHE = ".sandbox-tools-digests.json"


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _load(directory: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads((directory / DIGEST_CACHE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store(directory: Path, cache: dict[str, dict[str, str]]) -> None:
    target = directory / DIGEST_CACHE
    partial = directory / f".{DIGEST_CACHE}.{os.getpid()}.partial"
    try:
        partial.write_text(json.dumps(cache, indent=1, sort_keys=True))
        partial.replace(target)
    except OSError:
        partial.unlink(missing_ok=True)


def file_digest(path: Path) -> str | None:
    """SHA-256 of a regular file, from the cache when the file is provably unchanged."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    key = _stat_key(st)
    cache = _load(path.parent)
    entry = cache.get(path.name)
    if isinstance(entry, dict) and entry.get("stat") == key and "sha256" in entry:
        return entry["sha256"]
    digest = sha256_of(path)
    if _stat_key(path.stat()) == key:  # not modified while we hashed it
        cache[path.name] = {"stat": key, "sha256": digest}
        _store(path.parent, cache)
    return digest


def remember_digest(path: Path, digest: str) -> None:
    """Record a digest just computed elsewhere (the bytes before their rename into place)."""
    cache = _load(path.parent)
    cache[path.name] = {"stat": _stat_key(path.stat()), "sha256": digest}
    _store(path.parent, cache)


def file_matches(path: Path, size: int, sha256: str) -> bool:
    """Whether `path` holds exactly these bytes (size first: cheap refusals stay cheap)."""
    try:
        if path.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    return file_digest(path) == sha256
