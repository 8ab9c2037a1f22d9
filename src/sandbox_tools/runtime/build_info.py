"""What this runtime is: version, build id and platform (reported by runtime_info).

A built artifact carries `_build_info.json` beside this module, written at freeze
time; running from source reports build id "source".
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from sandbox_tools._version import __version__
from sandbox_tools.platforms import Arch

_BUILD_INFO_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_info.json")


@lru_cache(maxsize=1)
def build_info() -> dict[str, Any]:
    try:
        with open(_BUILD_INFO_FILE, encoding="utf-8") as handle:
            recorded: dict[str, Any] = json.load(handle)
    except (OSError, ValueError):
        recorded = {}
    try:
        platform = Arch.parse(os.uname().machine).platform
    except ValueError:
        platform = f"linux/{os.uname().machine}"
    return {
        "version": __version__,
        "build_id": recorded.get("build_id", "source"),
        "format": recorded.get("format", "source"),
        "platform": platform,
    }
