"""Environment and identity for processes the runtime starts on the model's behalf.

Children must see the container as it is, not the runtime's packaging: the
freezer's private variables are removed and any library path it changed is
restored, so `bash`, `ls` or a user's program load the container's own libraries.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from sandbox_tools.protocol import LAUNCHER_SELF_ENV

# Variables that only make sense to the runtime itself.
_PRIVATE_PREFIXES = ("_PYI_", "_MEIPASS", LAUNCHER_SELF_ENV)
_RESTORED = ("LD_LIBRARY_PATH",)
# What the portable launcher keeps from the runtime (saved as LAUNCHER_SELF_ENV + "_" +
# name): what the bundled loader obeys (the image's LD_PRELOAD loaded into the runtime),
# and the locale (a charset other than UTF-8 made the C library load the image's gconv
# module into the runtime; the runtime runs in the C locale). The commands it starts
# get them back as the image meant them, or not at all where the image had none.
LOADER_VARIABLES = (
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "LD_PROFILE_OUTPUT",
    "GCONV_PATH",
    "LOCPATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_COLLATE",
    "LC_MESSAGES",
    "LC_MONETARY",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_ADDRESS",
    "LC_IDENTIFICATION",
    "LC_MEASUREMENT",
    "LC_NAME",
    "LC_PAPER",
    "LC_TELEPHONE",
)


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_PREFIXES)}
    for name in _RESTORED:
        # PyInstaller saves the caller's value as <NAME>_ORIG before changing it.
        original = env.pop(f"{name}_ORIG", None)
        if original is not None:
            env[name] = original
        elif getattr(sys, "frozen", False) and LAUNCHER_SELF_ENV not in os.environ:
            # A onefile bootloader set it without a caller value to save: not ours to pass
            # on. (The portable launcher never sets it, so there it is the caller's.)
            env.pop(name, None)
    kept_by_launcher = LAUNCHER_SELF_ENV in os.environ
    for name in LOADER_VARIABLES:
        saved = os.environ.get(f"{LAUNCHER_SELF_ENV}_{name}")
        if saved is not None:
            env[name] = saved
        elif kept_by_launcher:  # the runtime's own value (its C locale), not the image's
            env.pop(name, None)
    if extra:
        env.update(extra)
    return env


# The server holds every session of every user. An agent can make the kernel's OOM killer
# pick it (memory charged to the container but not to the agent's own processes), so a
# root server lowers its own score; what it starts gets the default back, so the agent's
# processes, not the server, are what the OOM killer finds.
SERVER_OOM_SCORE_ADJ = -900


def protect_from_oom() -> None:
    """Lower this process's OOM score (only root may); elsewhere nothing changes."""
    if os.geteuid() == 0:
        _write_oom_score_adj("self", SERVER_OOM_SCORE_ADJ)


def unprotect(pid: int) -> None:
    """Give a child the default OOM score back (called by the server right after start)."""
    if os.geteuid() == 0:
        _write_oom_score_adj(str(pid), 0)


def _write_oom_score_adj(pid: str, value: int) -> None:
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as handle:
            handle.write(str(value))
    except OSError:
        pass  # no /proc, or not allowed: the score stays as it was
