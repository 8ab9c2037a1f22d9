"""The per-user cache: one root for debootstrapped base roots and fetched artifacts.

The `cache` setting (`SANDBOX_TOOLS_CACHE`) moves all of it (CI caches, read-only homes);
otherwise it follows XDG. The caller passes its resolved settings in. Standard library
only, so the injector can find artifacts without host extras.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from sandbox_tools.settings import Settings


def cache_root(where: Settings, environ: Mapping[str, str] = os.environ) -> Path:
    """The `cache` setting, else $XDG_CACHE_HOME/sandbox-tools, else ~/.cache/sandbox-tools."""
    if where.cache is not None:
        return where.cache
    xdg = environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sandbox-tools"


def artifact_cache_dir(where: Settings, version: str) -> Path:
    """Where `tools fetch` places verified artifacts and the injector looks for them."""
    return cache_root(where) / "artifacts" / version


@contextlib.contextmanager
def one_builder(entry: Path) -> Iterator[None]:
    """One maker of a cache entry on this host at a time: another process (a second
    checkout's `tools build`, a parallel test worker) making the same entry waits here,
    then finds it made. The lock is a file beside the entry, held for the block."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(entry.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
