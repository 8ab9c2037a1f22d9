"""The matrix as typed data, loaded from matrix.toml in this package."""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from types import UnionType
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from sandbox_tools.artifacts import TextEnum
from sandbox_tools.errors import ConfigurationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class OfflineKind(TextEnum):
    DEBOOTSTRAP = "debootstrap"  # "debootstrap:<suite>": a debootstrapped Debian root
    BUSYBOX = "busybox-static"  # Debian's static busybox alone: no libc at all
    NOSHELL = "noshell"  # not even a shell: nothing on PATH


@dataclass(frozen=True)
class OfflineRecipe:
    """How a row's image is made without a registry (matrix.toml's `offline`)."""

    kind: OfflineKind
    suite: str = ""  # debootstrap only

    @classmethod
    def parse(cls, text: str) -> OfflineRecipe:
        kind, _, suite = text.partition(":")
        if kind == OfflineKind.DEBOOTSTRAP and suite:
            return cls(OfflineKind.DEBOOTSTRAP, suite)
        if text in (OfflineKind.BUSYBOX, OfflineKind.NOSHELL):
            return cls(OfflineKind(text))
        raise ValueError(
            f"offline {text!r} is none of debootstrap:<suite>, busybox-static, noshell"
        )

    def __str__(self) -> str:
        return f"{self.kind}:{self.suite}" if self.suite else str(self.kind)


@dataclass(frozen=True, kw_only=True)
class Distro:
    name: str
    registry: str | None = None
    digest: str | None = None  # the manifest `registry` named when pinned (pins.py)
    offline: OfflineRecipe | None = None
    shell: bool = True
    command: list[str] | None = None  # the container's main process, if not `sleep infinity`

    @property
    def pull_reference(self) -> str | None:
        """What the Docker backend pulls: the tag at its pinned digest when there is one."""
        if self.registry is None:
            return None
        return f"{self.registry}@{self.digest}" if self.digest else self.registry


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    description: str
    user: str | None = None
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)
    expect_failure: bool = False
    # A browser cell: it runs the browser add-on (built beside the runtime) instead of the
    # runtime's tools, and only when an add-on of the cell's architecture is validated.
    browser: bool = False


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


def shell_less_skip(distro: Distro, scenario: Scenario) -> str | None:
    """Why a scenario cannot run on an image without a shell, or None if it can. Such a
    cell is skipped by design, whatever the machine: not a gap in the validation."""
    if distro.shell:
        return None
    if scenario.browser:
        return (
            "no shell: the browser cell serves its page with a program started through "
            "/bin/sh, which the image lacks"
        )
    if scenario.read_only:
        return (
            "no shell: a read-only root refuses uploads and there is no shell to stream "
            "the artifact through"
        )
    if scenario.user:
        return "no shell: uploads are owned by root, and nothing can hand them to another user"
    return None


def matching(names: list[str], selector: str) -> list[str]:
    """The distribution names a selector means: `debian-12`, `debian:12`, or a prefix
    (`debian`: every debian-*)."""
    wanted = selector.replace(":", "-")
    return [n for n in names if n == wanted or n.startswith(wanted + "-")]


T = TypeVar("T", Distro, Scenario)


def _row(kind: type[T], table: str, number: int, row: Any) -> T:
    """One [[table]] row as `kind`: unknown keys get a "did you mean", missing or
    mistyped ones a sentence naming the row, never a TypeError traceback."""
    where = f"matrix.toml [[{table}]] row {number}"
    remedy = "Fix the row in src/sandbox_tools/distro_matrix/matrix.toml."
    if not isinstance(row, dict):
        raise ConfigurationError(f"{where} is not a table", remedy=remedy)
    known = {f.name: f for f in fields(kind)}
    for key in row:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigurationError(
                f"{where} ({row.get('name', '?')}): unknown key {key!r}{hint}",
                remedy=f"Keys of a [[{table}]] row: " + ", ".join(known),
            )
    missing = [
        name
        for name, f in known.items()
        if name not in row and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ConfigurationError(
            f"{where}: missing {', '.join(repr(m) for m in missing)}", remedy=remedy
        )
    row = dict(row)
    if kind is Distro and isinstance(row.get("offline"), str):
        try:
            row["offline"] = OfflineRecipe.parse(row["offline"])
        except ValueError as exc:
            raise ConfigurationError(
                f"{where} ({row.get('name', '?')}): {exc}", remedy=remedy
            ) from None
    digest = row.get("digest")
    if kind is Distro and not (digest is None or re.fullmatch(r"sha256:[0-9a-f]{64}", str(digest))):
        raise ConfigurationError(
            f"{where} ({row.get('name', '?')}): digest {digest!r} is not sha256:<64 hex digits>",
            remedy="Refresh the pins: python -m sandbox_tools.distro_matrix.pins --refresh",
        )
    hints = get_type_hints(kind)
    for key, value in row.items():
        expected = hints[key]
        allowed = tuple(
            a if isinstance(a, type) else get_origin(a) or a
            for a in (get_args(expected) if get_origin(expected) is UnionType else (expected,))
        )
        allowed = tuple(type(None) if a is None else a for a in allowed)
        if not isinstance(value, tuple(a for a in allowed if isinstance(a, type))):
            wanted = " or ".join(getattr(a, "__name__", str(a)) for a in allowed)
            raise ConfigurationError(
                f"{where} ({row.get('name', '?')}): {key!r} is {type(value).__name__}, "
                f"expected {wanted}",
                remedy=remedy,
            )
    return kind(**row)


def load_matrix(text: str | None = None) -> Matrix:
    """The distribution matrix shipped with the package (or `text`, for tests)."""
    if text is None:
        text = (resources.files("sandbox_tools.distro_matrix") / "matrix.toml").read_text()
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"matrix.toml is not valid TOML: {exc}") from None
    distros = tuple(_row(Distro, "distro", n, r) for n, r in enumerate(data.get("distro", []), 1))
    scenarios = tuple(
        _row(Scenario, "scenario", n, r) for n, r in enumerate(data.get("scenario", []), 1)
    )
    return Matrix(distros, scenarios)
