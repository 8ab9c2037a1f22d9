"""`tools release`, `tools fetch`, `tools bundle create` and `tools wheel`."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from sandbox_tools import settings
from sandbox_tools._version import __version__
from sandbox_tools.cache import artifact_cache_dir
from sandbox_tools.cli.output import console, humans_to_stderr, notes
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.injector.acquire import checkout_root
from sandbox_tools.platforms import parse_arches
from sandbox_tools.release.bundle import bundle_name, create_bundle
from sandbox_tools.release.fetch import fetch
from sandbox_tools.release.manifest import (
    MANIFEST_FILE,
    Manifest,
    packaged_manifest,
    published_dir,
    read_manifest,
)
from sandbox_tools.release.publish import ReleaseRequest, publish
from sandbox_tools.release.targets import release_targets
from sandbox_tools.release.wheel import build_wheel


class TransferReporter:
    """A byte-accurate bar per transfer on a terminal; one line per transfer elsewhere."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}
        self.started: dict[str, float] = {}
        self.outcomes: list[tuple[str, str, str]] = []

    def start(self, label: str, total: int, completed: int = 0) -> Callable[[int], None]:
        self.started.setdefault(label, time.monotonic())
        progress = self.progress
        if progress is None:
            return lambda _n: None
        if label in self.tasks:
            progress.reset(self.tasks[label], total=total, completed=completed)
        else:
            self.tasks[label] = progress.add_task(label, total=total, completed=completed)
        task = self.tasks[label]
        return lambda n: progress.advance(task, n)

    def finish(self, label: str) -> None:
        began = self.started.pop(label, None)
        if self.progress is None and began is not None:
            notes.print(f"{label}: {time.monotonic() - began:.2f}s", highlight=False)

    def note(self, message: str) -> None:
        (self.progress.console if self.progress else notes).print(message, highlight=False)

    def outcome(self, target: str, name: str, action: str) -> None:
        self.outcomes.append((target, name, action))
        if self.progress is None:
            notes.print(f"{target}/{name}: {action}", highlight=False)


@contextlib.contextmanager
def transfer_reporter() -> Iterator[TransferReporter]:
    if not notes.is_terminal or notes.quiet:
        yield TransferReporter(None)
        return
    with Progress(
        TextColumn("{task.description}", style="bold"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=notes,
    ) as progress:
        yield TransferReporter(progress)


def _checkout() -> Path | None:
    """The git checkout this package runs from, if it runs from one."""
    root = checkout_root()
    return root if root is not None and (root / ".git").exists() else None


def _trusted_manifest(path: Path | None) -> Manifest:
    if path is not None:
        return read_manifest(path)
    manifest = packaged_manifest()
    if manifest is None:
        raise ConfigurationError(
            f"sandbox-tools {__version__} carries no released manifest (an unreleased checkout)",
            remedy="Pass --manifest FILE that you trust, or build locally with `tools build`.",
        )
    return manifest


def release_command(
    dist: Annotated[Path, typer.Option(help="Artifacts and build.json.")] = Path("dist"),
    validate_report: Annotated[
        Path, typer.Option(help="Report of `tools validate` for these artifacts.")
    ] = Path("validate-report.json"),
    version: Annotated[
        str | None, typer.Option(help="Refuse unless the package version is this.")
    ] = None,
    s3_bucket: Annotated[str | None, typer.Option(help="Publish to this S3 bucket.")] = None,
    s3_prefix: Annotated[
        str | None,
        typer.Option(help="Key prefix; {version} is replaced.  [default: releases/{version}]"),
    ] = None,
    s3_region: Annotated[
        str | None,
        typer.Option(help="Bucket region (default: AWS_REGION, else the bucket's own)."),
    ] = None,
    s3_endpoint_url: Annotated[
        str | None, typer.Option(help="S3-compatible endpoint (MinIO, moto, ...).")
    ] = None,
    s3_public_read: Annotated[
        bool | None,
        typer.Option(
            "--s3-public-read/--no-s3-public-read",
            help="Upload with the public-read ACL (new buckets disable ACLs: prefer a bucket "
            "policy or --s3-public-url). Default: off.",
            metavar="",
        ),
    ] = None,
    s3_public_url: Annotated[
        str | None, typer.Option(help="Public base URL of the prefix (e.g. a CDN).")
    ] = None,
    github_repo: Annotated[
        str | None, typer.Option(help="Publish a GitHub release in OWNER/NAME (GITHUB_TOKEN).")
    ] = None,
    github_tag: Annotated[
        str | None, typer.Option(help="Release tag; {version} is replaced.  [default: v{version}]")
    ] = None,
    github_api_url: Annotated[
        str | None, typer.Option(help="GitHub API base URL.  [default: https://api.github.com]")
    ] = None,
    github_web_url: Annotated[
        str | None, typer.Option(help="Base of the download URLs.  [default: https://github.com]")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Check and compare everything; upload nothing.", metavar="")
    ] = (False),
    allow_dirty: Annotated[
        bool, typer.Option(help="Allow uncommitted changes (only with --dry-run).", metavar="")
    ] = False,
    checkout: Annotated[
        Path | None, typer.Option(help="Git tree that must be clean (default: this checkout).")
    ] = None,
    package_manifest: Annotated[
        bool,
        typer.Option(
            help="Copy the manifest into the checkout's package (to commit); off for rehearsals.",
            metavar="",
        ),
    ] = True,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the manifest (with the URLs it carries) and every action as JSON on "
            "stdout; the rest on stderr.",
            metavar="",
        ),
    ] = False,
) -> None:
    """Publish the validated artifacts, SHA256SUMS and the manifest; verify the round trip.

    Where to publish can also come from `[tool.sandbox-tools]` in pyproject.toml or
    SANDBOX_TOOLS_* variables (s3-bucket, github-repo, ...); flags win.
    """
    if as_json:
        humans_to_stderr()
    flags = {
        "s3_bucket": s3_bucket,
        "s3_prefix": s3_prefix,
        "s3_region": s3_region,
        "s3_endpoint_url": s3_endpoint_url,
        "s3_public_read": s3_public_read,
        "s3_public_url": s3_public_url,
        "github_repo": github_repo,
        "github_tag": github_tag,
        "github_api_url": github_api_url,
        "github_web_url": github_web_url,
    }
    targets = release_targets(settings.with_flags(settings.current(), flags), __version__)
    tree = checkout if checkout is not None else _checkout()
    package_dir = (
        tree / "src" / "sandbox_tools" / "release" / "published"
        if package_manifest
        and tree is not None
        and (tree / "src" / "sandbox_tools" / "release").is_dir()
        else None
    )
    request = ReleaseRequest(
        dist=dist,
        validate_report=validate_report,
        checkout=tree,
        allow_dirty=allow_dirty,
        dry_run=dry_run,
        expected_version=version,
        publish_manifest_to=package_dir,
    )
    with transfer_reporter() as reporter:
        result = publish(request, targets, reporter)
    title = f"tools release {result.manifest.version}" + (" (dry run)" if dry_run else "")
    table = Table(title=title)
    for column in ("target", "file", "result"):
        table.add_column(column)
    summary: dict[tuple[str, str], list[str]] = {}
    for target, name, action in reporter.outcomes:
        summary.setdefault((target, name), []).append(action)
    for (target, name), actions in summary.items():
        table.add_row(target, name, ", ".join(actions))
    console.print(table)
    if as_json:
        document = {
            "version": result.manifest.version,
            "dry_run": dry_run,
            "manifest": result.manifest.to_json(),
            "actions": [
                {"target": target, "file": name, "action": action}
                for target, name, action in result.actions
            ],
        }
        print(json.dumps(document, indent=2))
    if dry_run:
        console.print("dry run: nothing was uploaded")
    elif package_dir is not None:
        console.print(
            f"wrote {package_dir}/{MANIFEST_FILE}: commit it, so that installs of this "
            "version know which bytes to fetch"
        )


def _usable_directory(path: Path, option: str) -> None:
    """A directory we can create and write into, checked before any download starts."""
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"{option} {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"{option} {path}: cannot create the directory ({exc.strerror or exc})"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{option} {path}: not writable")


def fetch_command(
    platform: Annotated[
        list[str] | None,
        typer.Option(
            "--platform",
            help="linux/amd64, arm64, x86_64, ...; repeatable or a,b (default: all).",
        ),
    ] = None,
    mirror: Annotated[
        list[str] | None, typer.Option(help="Base URL tried before the manifest's (repeatable).")
    ] = None,
    origin: Annotated[
        Path | None,
        typer.Option("--from", help="Offline: a directory of artifacts or a bundle tarball."),
    ] = None,
    manifest_path: Annotated[
        Path | None,
        typer.Option("--manifest", help="Manifest to trust (default: the installed package's)."),
    ] = None,
    dest: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "--dest",
            help="Directory to place them in (default: the injector's cache). --dest is the "
            "older name.",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the outcome as JSON on stdout; the rest on stderr.", metavar=""
        ),
    ] = False,
) -> None:
    """Obtain the manifest's artifacts, verified (size and SHA-256), where the injector looks."""
    if as_json:
        humans_to_stderr()
    manifest = _trusted_manifest(manifest_path)
    target_dir = dest if dest is not None else artifact_cache_dir(manifest.version)
    _usable_directory(target_dir, "--out")
    try:
        platforms = [arch.platform for arch in parse_arches(platform or [])]
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    started = time.monotonic()
    with transfer_reporter() as reporter:
        outcomes = fetch(manifest, target_dir, platforms, mirror or [], origin, reporter)
        for outcome in outcomes:
            source = f" from {outcome.source}" if outcome.source else ""
            reporter.outcome(
                outcome.artifact.platform, outcome.artifact.name, outcome.action + source
            )
    table = Table(
        title=f"tools fetch {manifest.version}: {target_dir} ({time.monotonic() - started:.1f}s)"
    )
    for column in ("platform", "artifact", "result", "source", "sha256"):
        table.add_column(column, overflow="fold")
    for outcome in outcomes:
        table.add_row(
            outcome.artifact.platform,
            outcome.artifact.name,
            "present, re-verified" if outcome.action == "present" else outcome.action,
            outcome.source or "-",
            outcome.artifact.sha256,
        )
    console.print(table)
    if as_json:
        document = {
            "version": manifest.version,
            "dest": str(target_dir),
            "artifacts": [
                {
                    "platform": o.artifact.platform,
                    "name": o.artifact.name,
                    "path": str(target_dir / o.artifact.name),
                    "sha256": o.artifact.sha256,
                    "result": o.action,
                    "source": o.source,
                }
                for o in outcomes
            ],
        }
        print(json.dumps(document, indent=2))


bundle_app = typer.Typer(help="Carry artifacts into an air-gapped network.", no_args_is_help=True)


@bundle_app.command("create")
def bundle_create(
    dist: Annotated[Path, typer.Option(help="Artifacts and their manifest.")] = Path("dist"),
    manifest_path: Annotated[
        Path | None, typer.Option("--manifest", help="Default: DIST/manifest.json.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Bundle file to write, or a directory to write it into."),
    ] = None,
) -> None:
    """Write one tarball with the manifest, SHA256SUMS and the artifacts."""
    manifest = read_manifest(manifest_path or dist / MANIFEST_FILE)
    target = out if out is not None else dist / bundle_name(manifest.version)
    if target.is_dir():  # like cp: a directory receives the file under its usual name
        target = target / bundle_name(manifest.version)
    path = create_bundle(dist, manifest, target)
    console.print(
        f"wrote {path} ({path.stat().st_size:,} bytes, {len(manifest.artifacts)} artifacts); "
        f"offline: `tools fetch --from {path.name}`"
    )


def wheel_command(
    dist: Annotated[Path, typer.Option(help="The released artifacts and build.json.")] = Path(
        "dist"
    ),
    manifest_path: Annotated[
        Path | None,
        typer.Option("--manifest", help="Default: the checkout's published manifest."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory for the wheel.")] = Path("dist/wheel"),
) -> None:
    """Build the package wheel with both platforms' artifacts bundled (verified first)."""
    tree = _checkout()
    if tree is None:
        raise ConfigurationError("`tools wheel` runs from a git checkout of sandbox-tools")
    manifest = read_manifest(manifest_path or published_dir() / MANIFEST_FILE)
    if manifest.version != __version__:
        raise ConfigurationError(
            f"the manifest is for {manifest.version}, the package is {__version__}"
        )
    with notes.status("building the wheel"):
        wheel = build_wheel(tree, dist, manifest, out)
    console.print(f"wrote {wheel} ({wheel.stat().st_size / 1e6:.1f} MB)")
