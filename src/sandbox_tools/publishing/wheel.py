"""The release wheel: the package with both platforms' artifacts inside, for pip installs.

The artifacts are checked against the manifest before they go in, and the wheel carries
that manifest twice: as the package's published manifest (what `tools fetch` and the
injector trust) and next to the artifacts with their build records (what the injector
reads to find them with `importlib.resources`, no network). The wheel is built from a
staged copy of the source tree, so the checkout never holds the artifacts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sandbox_tools.artifacts import Artifact, atomic_output, read_build_records, write_build_records
from sandbox_tools.errors import BuildError, ConfigurationError
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import (
    PUBLISHED_DIR,
    Manifest,
    verify_local,
    write_release_files,
)

BUNDLED_DIR = "_artifacts"  # src/sandbox_tools/_artifacts in the wheel


def _bundled_records(dist: Path, manifest: Manifest) -> list[Artifact]:
    by_name = {r.name: r for r in read_build_records(dist)}
    records = []
    for artifact in manifest.artifacts:
        record = by_name.get(artifact.name)
        if record is None or (record.sha256, record.build_id) != (
            artifact.sha256,
            artifact.build_id,
        ):
            raise ConfigurationError(
                f"{dist}/build.json has no record matching the manifest's {artifact.name}",
                remedy="Build the wheel from the dist/ the release was made from.",
            )
        records.append(record)
    return records


def build_wheel(checkout: Path, dist: Path, manifest: Manifest, out: Path) -> Path:
    """The release wheel: the package plus every platform's artifact, checked against the
    manifest, so `pip install` alone gives offline injection."""
    missing = sorted({a.platform for a in Arch} - {a.platform for a in manifest.artifacts})
    if missing:
        # The wheel promises every platform offline: one missing would fail at injection.
        raise ConfigurationError(
            f"the manifest has no artifact for {', '.join(missing)}",
            remedy="Release every platform (`tools build --all`) before building the wheel.",
        )
    problems = verify_local(dist, manifest)
    if problems:
        raise ConfigurationError(
            "the artifacts do not match the manifest: " + "; ".join(problems),
            remedy="Use the dist/ the release was made from, or `tools fetch --dest dist`.",
        )
    records = _bundled_records(dist, manifest)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sandbox-tools-wheel-") as tmp:
        stage = Path(tmp) / "src-tree"
        stage.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (checkout / name).exists():
                shutil.copy2(checkout / name, stage / name)
        shutil.copytree(
            checkout / "src",
            stage / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", BUNDLED_DIR),
        )
        package = stage / "src" / "sandbox_tools"
        published = package / "release" / PUBLISHED_DIR
        if published.exists():
            shutil.rmtree(published)
        published.mkdir()
        write_release_files(published, manifest)
        bundled = package / BUNDLED_DIR
        bundled.mkdir()
        for artifact in manifest.artifacts:
            shutil.copy2(dist / artifact.name, bundled / artifact.name)
        write_build_records(bundled, records)
        write_release_files(bundled, manifest)
        wheels = Path(tmp) / "wheels"
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "--wheel-dir",
                str(wheels),
                str(stage),
            ],
            capture_output=True,
            text=True,
        )
        if completed.returncode != 0:
            raise BuildError(
                "building the wheel failed:\n"
                + completed.stdout[-2000:]
                + completed.stderr[-2000:],
                remedy="Install the release extras (`pip install -e '.[release]'`: hatchling).",
            )
        (wheel,) = wheels.glob("*.whl")
        target = out / wheel.name
        with atomic_output(target) as handle, wheel.open("rb") as built:
            shutil.copyfileobj(built, handle)
    return target
