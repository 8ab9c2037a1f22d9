"""The validation report: what `tools validate` ran and found, as one typed document.

It is the contract between validate and release: `tools release` publishes only bytes
this report names (by SHA-256) whose static checks found nothing, with at least one
passing cell and none failing. Both
sides, and the tests, go through `ValidationReport.dump`/`load`; the schema is in
docs/SCHEMAS.md. Standard library only.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import Artifact, ArtifactKind, TextEnum, atomic_write

REPORT_SCHEMA = 2


class CellStatus(TextEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class CellResult:
    """One artifact x distribution x scenario, as it ran (or why it did not)."""

    artifact: str
    platform: str
    distro: str
    scenario: str
    status: CellStatus
    seconds: float = 0.0
    source: str = ""
    detail: str = ""
    checks: list[str] = field(default_factory=list)
    engine: str = ""  # which Docker engine ran the cell (several with --engine)

    @property
    def cell_id(self) -> str:
        return f"{self.distro}/{self.platform.removeprefix('linux/')}/{self.scenario}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value, "id": self.cell_id}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CellResult:
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not a JSON object")
        try:
            return cls(
                artifact=str(data["artifact"]),
                platform=str(data["platform"]),
                distro=str(data["distro"]),
                scenario=str(data["scenario"]),
                status=CellStatus(data["status"]),
                seconds=float(data.get("seconds", 0.0)),
                source=str(data.get("source", "")),
                detail=str(data.get("detail", "")),
                checks=[str(c) for c in data.get("checks", [])],
                engine=str(data.get("engine", "")),
            )
        except KeyError as exc:
            raise ValueError(f"{where} has no {exc.args[0]!r}") from None


@dataclass(frozen=True)
class EngineStatus:
    label: str
    kind: str
    reachable: bool
    error: str = ""


@dataclass
class ValidationReport:
    artifacts: list[Artifact]  # the exact bytes validated
    results: list[CellResult]
    engines: list[EngineStatus] = field(default_factory=list)
    unvalidated: list[str] = field(default_factory=list)  # asked for, nothing passed
    interrupted: bool = False
    # Artifact name -> what its static checks found (empty: sound). Static checks run
    # before any cell; when they find something, no cell runs and `results` is empty.
    static: dict[str, list[str]] = field(default_factory=dict)
    tool_version: str = __version__
    created: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        )
    )

    @property
    def summary(self) -> dict[str, int]:
        return {s.value: sum(r.status is s for r in self.results) for s in CellStatus}

    @property
    def passed(self) -> bool:
        """A failed static check or cell, an interruption, or a selection with nothing
        passing fails it."""
        return (
            not self.summary["failed"]
            and not self.unvalidated
            and not self.interrupted
            and not any(self.static.values())
        )

    def problems_for(self, artifact: Artifact) -> str | None:
        """Why `artifact` may not be released on the strength of this report, if it may not."""
        if not any(a.name == artifact.name and a.sha256 == artifact.sha256 for a in self.artifacts):
            return (
                f"it does not name {artifact.name} with sha256 {artifact.sha256}: "
                "these bytes were not validated"
            )
        found = self.static.get(artifact.name)
        if found:
            return f"static checks failed for {artifact.name}: {'; '.join(found)}"
        if found is None and artifact.kind is not ArtifactKind.RUNTIME:
            return f"no static checks ran for {artifact.name}"
        # A runtime's cells run its tools; an add-on's (the browser scenarios) run it.
        mine = [r for r in self.results if r.artifact == artifact.name]
        failed = [r.cell_id for r in mine if r.status is CellStatus.FAILED]
        if failed:
            return f"validation failed for {artifact.name}: {', '.join(failed)}"
        if not any(r.status is CellStatus.PASSED for r in mine):
            return f"no validation cell passed for {artifact.name}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "tool_version": self.tool_version,
            "created": self.created,
            "artifacts": [a.to_json() for a in self.artifacts],
            "engines": [asdict(e) for e in self.engines],
            "summary": self.summary,
            "passed": self.passed,
            "interrupted": self.interrupted,
            "unvalidated": list(self.unvalidated),
            "static": {name: list(found) for name, found in self.static.items()},
            "results": [r.to_json() for r in self.results],
        }

    def dump(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ValidationReport:
        """The report at `path`. OSError if unreadable; ValueError saying what is wrong."""
        try:
            data = json.loads(path.read_text())
        except UnicodeDecodeError:
            raise ValueError("not a JSON document") from None
        if not isinstance(data, dict) or "results" not in data or "artifacts" not in data:
            raise ValueError("it has no 'artifacts' and 'results'")
        if data.get("schema") != REPORT_SCHEMA:
            raise ValueError(
                f"report schema {data.get('schema')!r} is not {REPORT_SCHEMA} (written by "
                "another sandbox-tools version); run `tools validate` again"
            )
        artifacts, results = data["artifacts"], data["results"]
        if not isinstance(artifacts, list) or not isinstance(results, list):
            raise ValueError("'artifacts' and 'results' must be lists")
        engines = data.get("engines") or []
        static = data.get("static") or {}
        if not isinstance(static, dict):
            raise ValueError("'static' must be an object of artifact name -> problems")
        return cls(
            artifacts=[Artifact.from_json(a, f"artifact {n}") for n, a in enumerate(artifacts, 1)],
            results=[CellResult.from_json(r, f"result {n}") for n, r in enumerate(results, 1)],
            engines=[
                EngineStatus(str(e["label"]), str(e["kind"]), bool(e["reachable"]), str(e["error"]))
                for e in engines
                if isinstance(e, dict)
            ],
            unvalidated=[str(u) for u in data.get("unvalidated", [])],
            interrupted=bool(data.get("interrupted", False)),
            static={str(name): [str(p) for p in found or []] for name, found in static.items()},
            tool_version=str(data.get("tool_version", "")),
            created=str(data.get("created", "")),
        )


def write_reports(
    results: list[CellResult],
    json_path: Path,
    junit_path: Path,
    artifacts: list[Artifact],
    engines: Sequence[EngineStatus] = (),
    unvalidated: Sequence[str] = (),
    interrupted: bool = False,
    static: Mapping[str, list[str]] | None = None,
) -> None:
    """The JSON report and its JUnit form, side by side. `unvalidated`: what was asked
    for but had no passing cell; it makes the run fail. `static`: what each artifact's
    static checks found (a finding fails the run)."""
    report = ValidationReport(
        artifacts=[replace(a, path=None, provenance=None) for a in artifacts],
        results=results,
        engines=list(engines),
        unvalidated=list(unvalidated),
        interrupted=interrupted,
        static={name: list(found) for name, found in (static or {}).items()},
    )
    report.dump(json_path)
    summary = report.summary
    static_failures = sum(bool(found) for found in report.static.values())
    suite = ElementTree.Element(
        "testsuite",
        name="sandbox-tools validate",
        tests=str(len(results) + len(report.static)),
        failures=str(summary["failed"] + static_failures),
        skipped=str(summary["skipped"]),
    )
    for name, found in report.static.items():
        case = ElementTree.SubElement(
            suite, "testcase", classname=name, name="static checks", time="0.00"
        )
        if found:
            text = "; ".join(found)
            ElementTree.SubElement(case, "failure", message=text[:200]).text = text
    for result in results:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=result.artifact,
            name=result.cell_id,
            time=f"{result.seconds:.2f}",
        )
        if result.status is CellStatus.FAILED:
            ElementTree.SubElement(
                case, "failure", message=result.detail[:200]
            ).text = result.detail
        elif result.status is CellStatus.SKIPPED:
            ElementTree.SubElement(case, "skipped", message=result.detail)
    junit_path.parent.mkdir(parents=True, exist_ok=True)
    ElementTree.ElementTree(suite).write(junit_path, encoding="utf-8", xml_declaration=True)
