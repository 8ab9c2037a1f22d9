"""`tools manifest show|write|verify`: the version manifest of dist/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import ArtifactKind, read_build_records
from sandbox_tools.cli.output import console
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.release.manifest import (
    MANIFEST_FILE,
    Manifest,
    manifest_from_records,
    packaged_manifest,
    read_manifest,
    verify_local,
    write_release_files,
)

manifest_app = typer.Typer(
    help="The version manifest: one verified runtime per platform, and the optional browser "
    "add-ons.",
    no_args_is_help=True,
)
DistOption = Annotated[Path, typer.Option("--dist", help="Artifacts and build.json.")]


ManifestOption = Annotated[
    Path | None,
    typer.Option("--manifest", help="Default: DIST/manifest.json, else the installed package's."),
]


def _load(dist: Path, path: Path | None) -> Manifest:
    if path is not None:
        return read_manifest(path)
    if (dist / MANIFEST_FILE).exists():
        return read_manifest(dist / MANIFEST_FILE)
    packaged = packaged_manifest()
    if packaged is None:
        raise ConfigurationError(
            f"no {MANIFEST_FILE} in {dist} and none released with this package",
            remedy="Run `tools manifest write` after `tools build --all`, or pass --manifest.",
        )
    return packaged


@manifest_app.command("write")
def write(
    dist: DistOption = Path("dist"),
    mirror: Annotated[
        list[str] | None,
        typer.Option(help="Base URL the artifacts will be published under (repeatable)."),
    ] = None,
) -> None:
    """Write manifest.json and SHA256SUMS in DIST from its build records."""
    records = read_build_records(dist)
    if not records:
        raise ConfigurationError(f"no build records in {dist}; run `tools build` first")
    manifest = manifest_from_records(__version__, records, mirror or [])
    problems = verify_local(dist, manifest)
    if problems:
        raise ConfigurationError("; ".join(problems), remedy="Rebuild with `tools build`.")
    for path in write_release_files(dist, manifest):
        console.print(f"wrote {path}")


@manifest_app.command("show")
def show(
    dist: DistOption = Path("dist"),
    manifest_path: ManifestOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the manifest as JSON.", metavar="")
    ] = False,
) -> None:
    """Print the manifest as a table (or JSON)."""
    manifest = _load(dist, manifest_path)
    if as_json:
        print(manifest.dumps())
        return
    table = Table(title=f"sandbox-tools {manifest.version}: one runtime per platform, add-ons")
    for column in ("platform", "kind", "artifact", "format", "size", "sha256", "build id", "urls"):
        table.add_column(column, overflow="fold")
    for a in sorted(
        manifest.artifacts, key=lambda a: (a.platform, a.kind is not ArtifactKind.RUNTIME)
    ):
        table.add_row(
            a.platform,
            a.kind.value,
            a.name,
            a.format.value,
            f"{a.size:,}",
            a.sha256,
            a.build_id.removeprefix("sha256:")[:16] + "…",
            "\n".join(a.urls),
        )
    console.print(table)


@manifest_app.command("verify")
def verify(dist: DistOption = Path("dist"), manifest_path: ManifestOption = None) -> None:
    """Check the local files in DIST against the manifest (size and SHA-256)."""
    manifest = _load(dist, manifest_path)
    problems = verify_local(dist, manifest)
    for problem in problems:
        console.print(f"[bold red]mismatch:[/] {escape(problem)}", soft_wrap=True)
    if problems:
        raise typer.Exit(1)
    console.print(f"[green]all {len(manifest.artifacts)} artifacts match the manifest[/]")
