"""What the validate report must say before `tools release` publishes an artifact: a
runtime needs a passing cell and none failed; the browser add-on needs its exact bytes
named, static checks that ran and found nothing, and a passing browser cell, none
failed."""

from __future__ import annotations

from dataclasses import replace

from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind
from sandbox_tools.platforms import Arch
from sandbox_tools.validation import CellResult, CellStatus, ValidationReport

RUNTIME = Artifact(
    name="sandbox-tools-9-linux-amd64",
    arch=Arch.AMD64,
    format=ArtifactFormat.PORTABLE,
    size=10,
    sha256="a" * 64,
    build_id="sha256:" + "1" * 64,
)
ADDON = Artifact(
    name="sandbox-tools-browser-9-linux-amd64.tar.xz",
    arch=Arch.AMD64,
    format=ArtifactFormat.TAR_XZ,
    kind=ArtifactKind.BROWSER,
    size=20,
    sha256="b" * 64,
    build_id="sha256:" + "2" * 64,
)
PASSED = CellResult(RUNTIME.name, RUNTIME.platform, "debian-12", "root", CellStatus.PASSED)
BROWSER = CellResult(ADDON.name, ADDON.platform, "debian-12", "browser-root", CellStatus.PASSED)


def report(static: dict[str, list[str]], *artifacts: Artifact) -> ValidationReport:
    return ValidationReport(artifacts=list(artifacts), results=[PASSED, BROWSER], static=static)


def test_an_add_on_is_validated_by_its_static_checks_and_its_browser_cells() -> None:
    sound = report({RUNTIME.name: [], ADDON.name: []}, RUNTIME, ADDON)
    assert sound.problems_for(ADDON) is None
    assert sound.problems_for(RUNTIME) is None
    static_only = replace(sound, results=[PASSED])
    assert static_only.problems_for(ADDON) == f"no validation cell passed for {ADDON.name}"
    assert static_only.problems_for(RUNTIME) is None  # the runtime's cells are its own
    crashed = replace(BROWSER, scenario="browser-nonroot", status=CellStatus.FAILED)
    failing = replace(sound, results=[PASSED, BROWSER, crashed])
    assert failing.problems_for(ADDON) == (
        f"validation failed for {ADDON.name}: debian-12/amd64/browser-nonroot"
    )
    assert failing.problems_for(RUNTIME) is None


def test_an_add_on_needs_its_exact_bytes_named_and_its_checks_run_and_sound() -> None:
    assert "these bytes were not validated" in (
        report({ADDON.name: []}, RUNTIME).problems_for(ADDON) or ""
    )
    other_bytes = report({ADDON.name: []}, replace(ADDON, sha256="c" * 64))
    assert "these bytes were not validated" in (other_bytes.problems_for(ADDON) or "")
    assert report({}, ADDON).problems_for(ADDON) == f"no static checks ran for {ADDON.name}"
    found = report({ADDON.name: ["no fonts.conf"]}, ADDON).problems_for(ADDON)
    assert found == f"static checks failed for {ADDON.name}: no fonts.conf"


def test_a_runtime_still_needs_a_passing_cell() -> None:
    idle = ValidationReport(artifacts=[RUNTIME], results=[], static={RUNTIME.name: []})
    assert idle.problems_for(RUNTIME) == f"no validation cell passed for {RUNTIME.name}"


def test_only_the_browser_add_on_runs_the_browser_cells() -> None:
    """The desktop add-on is validated by its static checks until the runtime serves its
    tool: the browser's scenarios are not its own."""
    from sandbox_tools.distro_matrix.matrix import Distro, Matrix, Scenario
    from sandbox_tools.distro_matrix.runner import plan

    desktop = replace(
        ADDON, name="sandbox-tools-desktop-9-linux-amd64.tar.xz", kind=ArtifactKind.DESKTOP
    )
    matrix = Matrix(
        distros=(Distro(name="debian-12"),),
        scenarios=(
            Scenario(name="root", description="tools"),
            Scenario(name="browser-root", description="a page", browser=True),
        ),
    )
    rows = plan([RUNTIME], [ADDON, desktop], matrix)
    assert [(r.artifact.name, [s.name for s in r.scenarios]) for r in rows] == [
        (RUNTIME.name, ["root"]),
        (ADDON.name, ["browser-root"]),
    ]
