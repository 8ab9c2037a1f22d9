"""How sandbox_create makes a container: the options a client chose, checked and bounded.

The client is the user's, but what it asks for reaches the engine as it is, and a model
can be talked into asking for anything: a 45,000-character tmpfs path wedged runc and,
with it, every later call to the engine. So every option is bounded before the engine
sees it, and a container always gets memory, process, CPU and log bounds (the client may
choose other values, never none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandbox_tools.errors import RefusedToolCall

# The name of every container a gateway makes: this, then its sandbox id's token.
CONTAINER_PREFIX = "sandbox-tools-mcp-"
# What a client may ask for at most. Generous for real use, small enough that no engine
# or runtime chokes on it.
MAX_IMAGE_CHARS = 512
MAX_USER_CHARS = 64
MAX_PATH_CHARS = 1024
MAX_TMPFS_MOUNTS = 8
MAX_TMPFS_OPTIONS_CHARS = 256
MAX_ENV_VARS = 256
MAX_ENV_CHARS = 64 * 1024  # names and values together
# The bounds every container gets unless the client chooses others.
DEFAULT_MEMORY = "2g"
DEFAULT_PIDS = 1024
DEFAULT_CPUS = 2.0  # at most the engine's own count
DEFAULT_DISK = "10g"  # the writable layer, where the engine's storage driver can bound it
# The container's log (what `sleep infinity` and the init print: next to nothing) is
# bounded all the same: an agent writing to PID 1's stdout must not fill the host's disk.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "10m", "max-file": "1"}}

_MEMORY = re.compile(r"[1-9][0-9]{0,15}[bkmg]?", re.IGNORECASE)
_TMPFS_PATH = re.compile(r"/[A-Za-z0-9_./@+-]*")
_TMPFS_OPTIONS = re.compile(r"[A-Za-z0-9_=,.+-]*")


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """The fields of the inspect `docker_sdk` sandbox's config (DockerSdkConfig) a
    client may choose, as `docker run` options."""

    image: str
    user: str | None = None
    read_only: bool = False
    tmpfs: dict[str, str] | None = None
    network_mode: str = "none"
    working_dir: str | None = None
    environment: dict[str, str] | None = None
    mem_limit: str = DEFAULT_MEMORY
    pids_limit: int = DEFAULT_PIDS
    cpus: float | None = None  # None: DEFAULT_CPUS, or the engine's count if fewer
    disk_limit: str = DEFAULT_DISK  # where the engine can bound the writable layer

    def check(self) -> None:
        """Refuse what no engine should be handed, with the bound that was passed."""
        problems = list(self._problems())
        if problems:
            raise RefusedToolCall("sandbox_create: " + "; ".join(problems))

    def _problems(self) -> list[str]:
        found: list[str] = []
        if not self.image.strip() or len(self.image) > MAX_IMAGE_CHARS:
            found.append(f"image must be a name of 1 to {MAX_IMAGE_CHARS} characters")
        if self.user is not None and not 0 < len(self.user) <= MAX_USER_CHARS:
            found.append(f"user must be 1 to {MAX_USER_CHARS} characters")
        if self.working_dir is not None and not _absolute(self.working_dir):
            found.append(f"working_dir must be an absolute path of at most {MAX_PATH_CHARS}")
        tmpfs = self.tmpfs or {}
        if len(tmpfs) > MAX_TMPFS_MOUNTS:
            found.append(f"tmpfs takes at most {MAX_TMPFS_MOUNTS} mounts")
        for path, options in list(tmpfs.items())[:MAX_TMPFS_MOUNTS]:
            if path == "/" or not _absolute(path) or not _TMPFS_PATH.fullmatch(path):
                found.append(
                    f"tmpfs path {path[:60]!r} must be an absolute path other than / of at "
                    f"most {MAX_PATH_CHARS} characters: letters, digits and _ . / @ + -"
                )
            if len(options) > MAX_TMPFS_OPTIONS_CHARS or not _TMPFS_OPTIONS.fullmatch(options):
                found.append(
                    f"tmpfs options {options[:60]!r} must be mount options such as "
                    f'"exec,size=256m" (at most {MAX_TMPFS_OPTIONS_CHARS} characters)'
                )
        environment = self.environment or {}
        if len(environment) > MAX_ENV_VARS:
            found.append(f"environment takes at most {MAX_ENV_VARS} variables")
        if sum(len(k) + len(v) for k, v in environment.items()) > MAX_ENV_CHARS:
            found.append(f"environment takes at most {MAX_ENV_CHARS:,} characters in all")
        for name in ("mem_limit", "disk_limit"):
            value = getattr(self, name)
            if not _MEMORY.fullmatch(value):
                found.append(f'{name} {value[:40]!r} must be a size such as "512m" or "4g"')
        return found

    def run_options(self, engine_cpus: int) -> dict[str, Any]:
        """The docker SDK's `containers.create` options (the image and command aside);
        `engine_cpus`: how many the engine has (a CPU bound above it is refused there)."""
        # A CPU count the client chose goes as it is (the engine refuses more than it has,
        # and says so); the default is what the engine has, up to DEFAULT_CPUS.
        cpus = self.cpus if self.cpus is not None else min(DEFAULT_CPUS, max(engine_cpus, 1))
        options: dict[str, Any] = {
            "network_mode": self.network_mode,
            "read_only": self.read_only,
            "environment": dict(self.environment or {}),
            "init": True,  # reaps orphans: what the agent leaves behind does not pile up
            "mem_limit": self.mem_limit,
            "pids_limit": self.pids_limit,
            "nano_cpus": int(cpus * 1e9),
            "log_config": LOG_CONFIG,
        }
        tmpfs = self.tmpfs
        if self.read_only and not tmpfs:
            # The runtime needs a writable place that allows execution to live in.
            tmpfs = {"/tmp": "exec"}
        if tmpfs:
            options["tmpfs"] = dict(tmpfs)
        for name in ("user", "working_dir"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options


def _absolute(path: str) -> bool:
    return path.startswith("/") and len(path) <= MAX_PATH_CHARS and "\0" not in path
