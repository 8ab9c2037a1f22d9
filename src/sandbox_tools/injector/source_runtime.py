"""Running the runtime straight from this checkout (before any artifact is built).

Locally that is this interpreter with the package on its path; in a container
that has a python3 it is the package directory mounted read-only at
SOURCE_MOUNT. The runtime is stdlib-only, so nothing needs installing there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import sandbox_tools
from sandbox_tools.protocol import SERVER_DIR_ENV

SOURCE_MOUNT = "/opt/sandbox-tools-src"


@dataclass(frozen=True)
class RuntimeLaunch:
    """How to start the runtime in one sandbox: argv prefix plus environment."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


def package_parent() -> Path:
    """The directory that contains the `sandbox_tools` package (src/ in a checkout)."""
    return Path(sandbox_tools.__file__).resolve().parent.parent


def local_source_runtime(server_dir: str | None = None) -> RuntimeLaunch:
    """The runtime from this checkout's sources on this machine (tests, `tools exec-remote`)."""
    env = {"PYTHONPATH": str(package_parent())}
    if server_dir:
        env[SERVER_DIR_ENV] = server_dir
    return RuntimeLaunch([sys.executable, "-m", "sandbox_tools.runtime"], env)


def mounted_source_runtime(python: str = "python3") -> RuntimeLaunch:
    """The runtime from sources mounted read-only at SOURCE_MOUNT in a container with Python."""
    return RuntimeLaunch(
        [python, "-m", "sandbox_tools.runtime"],
        {"PYTHONPATH": SOURCE_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"},
    )
