"""The matrix as typed data, loaded from matrix.toml in this package."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from sandbox_tools.errors import ConfigurationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True, kw_only=True)
class Distro:
    name: str
    registry: str | None = None
    offline: str | None = None
    shell: bool = True
    command: list[str] | None = None  # the container's main process, if not `sleep infinity`


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    description: str
    user: str | None = None
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)
    expect_failure: bool = False


@dataclass(frozen=True)
class Matrix:
    distros: tuple[Distro, ...]
    scenarios: tuple[Scenario, ...]

    def select(self, only: list[str] | None) -> Matrix:
        """`--only debian-12`, `--only debian:12` or `--only debian` (a prefix)."""
        if not only:
            return self
        wanted = [o.replace(":", "-") for o in only]
        names = [d.name for d in self.distros]
        for selector in wanted:
            if not any(n == selector or n.startswith(selector + "-") for n in names):
                close = difflib.get_close_matches(selector, names, n=3, cutoff=0.5)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ConfigurationError(
                    f"--only {selector!r} matches no distribution in the matrix{hint}",
                    remedy="Choose from: " + ", ".join(names),
                )
        return Matrix(
            tuple(
                d
                for d in self.distros
                if any(d.name == w or d.name.startswith(w + "-") or d.name == w for w in wanted)
            ),
            self.scenarios,
        )


def load_matrix(text: str | None = None) -> Matrix:
    """The distribution matrix shipped with the package (or `text`, for tests)."""
    if text is None:
        text = (resources.files("sandbox_tools.distro_matrix") / "matrix.toml").read_text()
    data: dict[str, Any] = tomllib.loads(text)
    distros = tuple(Distro(**row) for row in data.get("distro", []))
    scenarios = tuple(Scenario(**row) for row in data.get("scenario", []))
    return Matrix(distros, scenarios)
