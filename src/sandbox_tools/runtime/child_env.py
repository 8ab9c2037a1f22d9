"""Environment and identity for processes the runtime starts on the model's behalf.

Children must see the container as it is, not the runtime's packaging: the
freezer's private variables are removed and any library path it changed is
restored, so `bash`, `ls` or a user's program load the container's own libraries.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox_tools.runtime.jsonrpc import ToolError

# Variables that only make sense to the runtime itself.
_PRIVATE_PREFIXES = ("_PYI_", "_MEIPASS", "SANDBOX_TOOLS_SELF")
_RESTORED = ("LD_LIBRARY_PATH",)


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_PREFIXES)}
    for name in _RESTORED:
        # PyInstaller saves the caller's value as <NAME>_ORIG before changing it.
        original = env.pop(f"{name}_ORIG", None)
        if original is not None:
            env[name] = original
        elif getattr(sys, "frozen", False) and "SANDBOX_TOOLS_SELF" not in os.environ:
            # A onefile bootloader set it without a caller value to save: not ours to pass
            # on. (The portable launcher never sets it, so there it is the caller's.)
            env.pop(name, None)
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True)
class Identity:
    """Who a child runs as; uid/gid are None when it runs as the server's own user."""

    uid: int | None
    gid: int | None
    groups: list[int] | None
    home: str | None
    name: str | None

    def env(self) -> dict[str, str]:
        if self.name is None or self.home is None:
            return {}
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def resolve_user(user: str | None) -> Identity:
    """Look up `user` (name or numeric uid); switching requires running as root."""
    if user is None:
        return Identity(None, None, None, None, None)
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError):
        raise ToolError(f"user {user!r} does not exist in this container") from None
    if entry.pw_uid == os.geteuid():
        return Identity(None, None, None, entry.pw_dir, entry.pw_name)
    if os.geteuid() != 0:
        raise ToolError(
            f"cannot run as user {user!r}: the runtime runs as uid {os.geteuid()}, "
            "and only root can switch users"
        )
    try:
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    except OSError:
        groups = [entry.pw_gid]
    return Identity(entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_name)
