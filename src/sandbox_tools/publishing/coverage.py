"""What the validate report says about the bytes being released, row by row.

`tools release` shows it before publishing (dry run or not): for each platform, which
distributions passed and which were skipped, and why. A maintainer may also require
distributions (`--require`, or `release-require` in `[tool.sandbox-tools]`): each must
have been validated in full for every released platform. A cell skipped by design (a
scenario that cannot run on an image without a shell) is no gap; a cell skipped because
the image could not be had (an unreachable registry) is, and so is a row validate never
ran.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.distro_matrix.matrix import Matrix, load_matrix, matching, shell_less_skip
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.release.manifest import Manifest, kind_label
from sandbox_tools.validation import CellResult, CellStatus, ValidationReport

REQUIRE_HOW = (
    "--require, or release-require in [tool.sandbox-tools] / SANDBOX_TOOLS_RELEASE_REQUIRE"
)


def row_label(platform: str, kind: ArtifactKind) -> str:
    """The platform, and the add-on when the cells are an add-on's."""
    return platform if kind is ArtifactKind.RUNTIME else f"{platform} {kind_label(kind)}"


@dataclass(frozen=True)
class Row:
    """One distribution on one platform, for one artifact, as the report has it."""

    platform: str
    distro: str
    passed: tuple[str, ...]  # scenarios
    skipped: tuple[tuple[str, str], ...]  # (scenario, reason): could have run, did not
    by_design: tuple[tuple[str, str], ...]  # (scenario, reason): cannot run on this row
    kind: ArtifactKind = ArtifactKind.RUNTIME  # whose cells: the runtime's or an add-on's

    @property
    def label(self) -> str:
        return row_label(self.platform, self.kind)

    @property
    def state(self) -> str:
        if not self.passed:
            return "skipped"
        return "partly skipped" if self.skipped else "passed"

    @property
    def reason(self) -> str:
        """Why cells were skipped, in one line (the same reason is said once)."""
        if not self.passed:
            why = self.skipped or self.by_design
            return "; ".join(dict.fromkeys(reason for _, reason in why))
        return "; ".join(f"{scenario}: {reason}" for scenario, reason in self.skipped)

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "kind": self.kind.value,
            "distro": self.distro,
            "state": self.state,
            "passed": list(self.passed),
            "skipped": [{"scenario": s, "reason": r} for s, r in self.skipped],
            "skipped_by_design": [{"scenario": s, "reason": r} for s, r in self.by_design],
        }


@dataclass(frozen=True)
class Coverage:
    report: Path
    created: str
    rows: tuple[Row, ...]
    required: tuple[str, ...]  # distribution names, selectors resolved
    gaps: tuple[str, ...]  # why a required distribution is not validated in full

    def to_json(self) -> dict[str, Any]:
        return {
            "report": str(self.report),
            "created": self.created,
            "required": list(self.required),
            "gaps": list(self.gaps),
            "rows": [row.to_json() for row in self.rows],
        }

    def groups(self) -> list[tuple[str, str, list[str], str]]:
        """(platform, state, distributions, reason): rows alike said once, passed first."""
        order = {"passed": 0, "partly skipped": 1, "skipped": 2}
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for row in sorted(self.rows, key=lambda r: (r.label, order[r.state])):
            grouped.setdefault((row.label, row.state, row.reason), []).append(row.distro)
        return [(p, state, names, reason) for (p, state, reason), names in grouped.items()]

    def gap_remedy(self, matrix: Matrix | None = None) -> str:
        """How to validate the required distributions that are gaps. Only a row whose
        image comes from a registry alone needs a machine that reaches the registry; a
        row with an offline recipe builds its image from Debian's mirror wherever
        validate runs (matrix.toml's `offline`)."""
        distros = {d.name: d for d in (matrix or load_matrix()).distros}
        names = list(dict.fromkeys(gap.split(" ", 1)[0] for gap in self.gaps))
        registry_only = [n for n in names if n in distros and distros[n].offline is None]
        offline = [n for n in names if n not in registry_only]
        steps = []
        if registry_only:
            steps.append(
                f"`tools validate --only {' --only '.join(registry_only)}` on a machine that "
                "reaches the registry (they have no offline recipe)"
            )
        if offline:
            steps.append(
                f"`tools validate --only {' --only '.join(offline)}` (their images are also "
                "built offline, from Debian's mirror)"
            )
        return (
            f"Validate them with {'; and '.join(steps)}, then release with the new report; "
            "or require less (--require, release-require)."
        )

    def required_line(self) -> str:
        if not self.required:
            return f"required distributions: none ({REQUIRE_HOW})"
        if self.gaps:
            verdict = "NOT validated in full"
        else:
            # Cells a row cannot run (a scenario needing a shell, on an image without one)
            # are no gap, but "every cell passed" would hide them.
            by_design = sum(len(row.by_design) for row in self.rows if row.distro in self.required)
            verdict = (
                f"every cell that can run there passed; {by_design} skipped by design "
                "(they need a shell the image lacks)"
                if by_design
                else "every cell passed"
            )
        return f"required distributions: {', '.join(self.required)}: {verdict}"


def resolve_required(selectors: Sequence[str], matrix: Matrix | None = None) -> tuple[str, ...]:
    """Selectors (`debian-12`, `debian:12`, `debian`) as matrix distribution names; one
    that matches nothing is bad input, with a "did you mean"."""
    names = [d.name for d in (matrix or load_matrix()).distros]
    resolved: list[str] = []
    for selector in selectors:
        found = matching(names, selector)
        if not found:
            close = difflib.get_close_matches(selector.replace(":", "-"), names, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigurationError(
                f"required distribution {selector!r} matches no distribution in the matrix{hint}",
                remedy=f"Fix {REQUIRE_HOW}. Choose from: " + ", ".join(names),
            )
        resolved += [name for name in found if name not in resolved]
    return tuple(resolved)


def coverage(
    report: ValidationReport,
    where: Path,
    manifest: Manifest,
    required: Sequence[str] = (),
    matrix: Matrix | None = None,
) -> Coverage:
    """The report's rows for the manifest's artifacts (a runtime's tool cells, an
    add-on's browser cells), and the gaps in `required` (names resolved by
    `resolve_required`): a release that carries an add-on requires its cells on the
    required distributions as it requires the runtime's."""
    matrix = matrix or load_matrix()
    distros = {d.name: d for d in matrix.distros}
    scenarios = {s.name: s for s in matrix.scenarios}
    rows: list[Row] = []
    released = sorted(
        manifest.artifacts, key=lambda a: (a.kind is not ArtifactKind.RUNTIME, a.platform)
    )
    for artifact in released:
        cells: dict[str, list[CellResult]] = {}
        for result in report.results:
            if result.artifact == artifact.name:
                cells.setdefault(result.distro, []).append(result)
        for distro_name, results in sorted(cells.items()):
            passed: list[str] = []
            skipped: list[tuple[str, str]] = []
            by_design: list[tuple[str, str]] = []
            for result in sorted(results, key=lambda r: r.scenario):
                if result.status is CellStatus.PASSED:
                    passed.append(result.scenario)
                elif result.status is CellStatus.SKIPPED:
                    distro, scenario = distros.get(distro_name), scenarios.get(result.scenario)
                    designed = (
                        distro is not None
                        and scenario is not None
                        and shell_less_skip(distro, scenario) is not None
                    )
                    (by_design if designed else skipped).append((result.scenario, result.detail))
            rows.append(
                Row(
                    artifact.platform,
                    distro_name,
                    tuple(passed),
                    tuple(skipped),
                    tuple(by_design),
                    artifact.kind,
                )
            )
    by_key = {(row.label, row.distro): row for row in rows}
    gaps: list[str] = []
    for name in required:
        for artifact in released:
            label = row_label(artifact.platform, artifact.kind)
            row = by_key.get((label, name))
            if row is None:
                gaps.append(f"{name} on {label}: not in the report (validate did not run it)")
            elif row.skipped:
                names = ", ".join(scenario for scenario, _ in row.skipped)
                gaps.append(f"{name} on {label}: skipped {names} ({row.reason})")
            elif not row.passed and not row.by_design:
                gaps.append(f"{name} on {label}: no cell passed")
    return Coverage(where, report.created, tuple(rows), tuple(required), tuple(gaps))
