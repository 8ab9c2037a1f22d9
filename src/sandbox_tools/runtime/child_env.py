"""Environment and identity for processes the runtime starts on the model's behalf.

Children must see the container as it is, not the runtime's packaging: the
freezer's private variables are removed and any library path it changed is
restored, so `bash`, `ls` or a user's program load the container's own libraries.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

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
