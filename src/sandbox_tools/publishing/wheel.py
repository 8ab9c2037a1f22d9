"""The release wheel: the package with both platforms' runtimes inside, for pip installs.

The runtimes are checked against the manifest before they go in, and the wheel carries
that manifest twice: whole, as the package's published manifest (what `tools fetch` and
the injector trust, so an add-on it lists can still be fetched), and restricted to the
runtimes next to them with their build records (what the injector reads to find them
with `importlib.resources`, no network). The wheel never bundles an add-on: the browser
add-on is about 100 MB per platform, and optional (`tools fetch --with-browser`, or the
injector downloads it when a sample asks for the browser). The wheel is built from a
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
    for artifact in manifest.runtimes:
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
    """The release wheel: the package plus every platform's runtime, checked against the
    manifest, so `pip install` alone gives offline injection (add-ons stay out)."""
    missing = sorted({a.platform for a in Arch} - {a.platform for a in manifest.runtimes})
    if missing:
        # The wheel promises every platform offline: one missing would fail at injection.
        raise ConfigurationError(
            f"the manifest has no artifact for {', '.join(missing)}",
            remedy="Release every platform (`tools build --all`) before building the wheel.",
        )
    carried = manifest.only(manifest.runtimes)
    problems = verify_local(dist, carried)
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
        for artifact in carried.artifacts:
            shutil.copy2(dist / artifact.name, bundled / artifact.name)
        write_build_records(bundled, records)
        # What this directory holds: `sha256sum -c SHA256SUMS` passes in it.
        write_release_files(bundled, carried)
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
