"""The per-user cache: one root for debootstrapped base roots and fetched artifacts.

`SANDBOX_TOOLS_CACHE` moves all of it (CI caches, read-only homes); otherwise it follows
XDG. Standard library only, so the injector can find artifacts without host extras.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_tools import settings


def cache_root() -> Path:
    """The cache root: $SANDBOX_TOOLS_CACHE, else $XDG_CACHE_HOME/sandbox-tools, else ~/.cache."""
    configured = settings.current().cache
    if configured is not None:
        return configured
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sandbox-tools"


def artifact_cache_dir(version: str) -> Path:
    """Where `tools fetch` places verified artifacts and the injector looks for them."""
    return cache_root() / "artifacts" / version
