"""`tools release`, `tools fetch`, `tools bundle create` and `tools wheel`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
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
from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.cache import artifact_cache_dir
from sandbox_tools.cli.invocation import invocation
from sandbox_tools.cli.output import (
    actions_error,
    append_step_summary,
    console,
    humans_to_stderr,
    notes,
    one_line,
    print_json,
    raise_verbosity,
    verbose,
)
from sandbox_tools.errors import ConfigurationError, SandboxToolsError
from sandbox_tools.injector.acquire import checkout_root, local_dist
from sandbox_tools.platforms import Arch, parse_arches
from sandbox_tools.publishing.coverage import Coverage
from sandbox_tools.publishing.publish import (
    ReleaseRequest,
    ReleaseResult,
    addon_summary,
    check_allow_dirty,
    publish,
)
from sandbox_tools.publishing.targets import release_targets
from sandbox_tools.publishing.wheel import build_wheel
from sandbox_tools.release.bundle import bundle_name, bundled_manifest, create_bundle
from sandbox_tools.release.fetch import fetch_artifacts, sources_for, wanted_artifacts
from sandbox_tools.release.manifest import (
    MANIFEST_FILE,
    Manifest,
    packaged_manifest,
    published_dir,
    read_manifest,
)
from sandbox_tools.settings import Settings

STATE_STYLE = {"passed": "green", "partly skipped": "yellow", "skipped": "yellow"}


class TransferReporter:
    """A byte-accurate bar per transfer on a terminal; one line per transfer elsewhere."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}
        self.started: dict[str, float] = {}
        self.outcomes: list[tuple[str, str, str]] = []
        self.coverage: Coverage | None = None

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
        # URLs and digests stay on one line: they are copied, and grepped in CI logs.
        out = self.progress.console if self.progress else notes
        out.print(message, highlight=False, markup=False, soft_wrap=True)

    def outcome(self, target: str, name: str, action: str) -> None:
        self.outcomes.append((target, name, action))
        if self.progress is None:
            notes.print(f"{target}/{name}: {action}", highlight=False, soft_wrap=True)

    def validated(self, coverage: Coverage) -> None:
        """What was validated and what was skipped: shown before anything is published."""
        self.coverage = coverage
        out = self.progress.console if self.progress is not None else console
        # The report's path on a line of its own, never folded: it is copied from here.
        out.print(
            f"validated by {coverage.report} ({coverage.created})",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        out.print(_coverage_table(coverage))
        out.print(coverage.required_line(), highlight=False, markup=False, soft_wrap=True)


def _coverage_table(coverage: Coverage) -> Table:
    table = Table()
    for column in ("platform", "result", "distributions", "why skipped"):
        table.add_column(column, overflow="fold")
    for platform, state, names, reason in coverage.groups():
        table.add_row(
            platform,
            f"[{STATE_STYLE[state]}]{state}[/]",
            escape(", ".join(names)),
            escape(reason),
        )
    if not coverage.rows:
        table.add_row("-", "-", "no cell in the report for these artifacts", "")
    return table


def _coverage_markdown(coverage: Coverage) -> list[str]:
    lines = [
        f"Validated by `{coverage.report}` ({coverage.created}):",
        "",
        "| platform | result | distributions | why skipped |",
        "|---|---|---|---|",
    ]
    for platform, state, names, reason in coverage.groups():
        cell = one_line(reason).replace("|", "\\|") if reason else ""
        lines.append(f"| {platform} | {state} | {', '.join(names)} | {cell} |")
    lines += ["", coverage.required_line()]
    lines += [f"- {gap}" for gap in coverage.gaps]
    return lines


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


def _trusted_manifest(
    path: Path | None, settings: Settings, arches: list[Arch], with_browser: bool
) -> Manifest:
    if path is not None:
        return read_manifest(path)
    manifest = packaged_manifest()
    if manifest is None:
        # What the injector would say: where it looks for local builds, and the command.
        where = local_dist(settings)
        host = [Arch.parse(os.uname().machine)]
        flags = " ".join(f"--arch {arch.value}" for arch in arches or host)
        addon = " --with-browser" if with_browser else ""
        raise ConfigurationError(
            f"sandbox-tools {__version__} carries no released manifest (an unreleased "
            "install: a git install or a checkout), so there is nothing to fetch",
            remedy=f"Pass --manifest FILE that you trust, or build the runtime where the "
            f"injector looks: `tools build {flags}{addon} --out {where}`.",
        )
    return manifest


def release_command(
    ctx: typer.Context,
    dist: Annotated[Path, typer.Option(metavar="DIR", help="Artifacts and build.json.")] = Path(
        "dist"
    ),
    validate_report: Annotated[
        Path,
        typer.Option(metavar="FILE", help="Report of `tools validate` for these artifacts."),
    ] = Path("validate-report.json"),
    version: Annotated[
        str | None,
        typer.Option(metavar="VERSION", help="Refuse unless the package version is this."),
    ] = None,
    require: Annotated[
        list[str] | None,
        typer.Option(
            "--require",
            metavar="DISTRO",
            help="Refuse unless every cell of this matrix distribution (or family, the name "
            "before the dash: debian means every debian-*) passed for every platform in the "
            "validate report, none skipped but those a shell-less image cannot run; "
            "repeatable or a,b. Replaces release-require from the settings; --require '' "
            "requires none.",
        ),
    ] = None,
    s3_bucket: Annotated[
        str | None, typer.Option(metavar="BUCKET", help="Publish to this S3 bucket.")
    ] = None,
    s3_prefix: Annotated[
        str | None,
        typer.Option(
            metavar="PREFIX",
            help="Key prefix; {version} is replaced.  \\[default: releases/{version}]",
        ),
    ] = None,
    s3_region: Annotated[
        str | None,
        typer.Option(
            metavar="REGION",
            help="Bucket region (default: AWS_REGION, else the bucket's own).",
        ),
    ] = None,
    s3_endpoint_url: Annotated[
        str | None,
        typer.Option(metavar="URL", help="S3-compatible endpoint (MinIO, moto, ...)."),
    ] = None,
    s3_public_read: Annotated[
        bool | None,
        typer.Option(
            "--s3-public-read/--no-s3-public-read",
            help="Upload with the public-read ACL (new buckets disable ACLs: prefer a bucket "
            "policy or --s3-public-url). Default: off. Either way the release refuses unless "
            "users can download anonymously.",
            metavar="",
        ),
    ] = None,
    s3_public_url: Annotated[
        str | None,
        typer.Option(metavar="URL", help="Public base URL of the prefix (e.g. a CDN)."),
    ] = None,
    github_repo: Annotated[
        str | None,
        typer.Option(
            metavar="OWNER/NAME", help="Publish a GitHub release in OWNER/NAME (GITHUB_TOKEN)."
        ),
    ] = None,
    github_tag: Annotated[
        str | None,
        typer.Option(
            metavar="TAG", help="Release tag; {version} is replaced.  \\[default: v{version}]"
        ),
    ] = None,
    github_api_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL", help="GitHub API base URL.  \\[default: https://api.github.com]"
        ),
    ] = None,
    github_web_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL", help="Base of the download URLs.  \\[default: https://github.com]"
        ),
    ] = None,
    github_draft: Annotated[
        bool,
        typer.Option(
            "--github-draft",
            help="Upload and verify, but leave the GitHub release a draft, which needs no "
            "tag: the same command without this flag publishes it, and refuses unless the "
            "tag exists (GitHub would create a missing one at the default branch's head). "
            "An already published release stays published.",
            metavar="",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Check and compare everything; upload nothing.", metavar="")
    ] = (False),
    allow_dirty: Annotated[
        bool,
        typer.Option(
            help="Allow uncommitted changes (only with --dry-run; without it, bad input).",
            metavar="",
        ),
    ] = False,
    checkout: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Git tree that must be clean (default: this checkout)."),
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
            help="Print the manifest (with the URLs it carries), what was validated and every "
            "action as JSON on stdout; the rest on stderr.",
            metavar="",
        ),
    ] = False,
) -> None:
    """Publish the validated artifacts, SHA256SUMS and the manifest; verify the round trip.

    Where to publish, and which distributions must have passed (release-require), can
    also come from \\[tool.sandbox-tools] in pyproject.toml or SANDBOX_TOOLS_* variables
    (s3-bucket, github-repo, ...); flags win. Users download anonymously: the release
    checks, and verifies, every object the way they will get it.
    """
    if as_json:
        humans_to_stderr()
    check_allow_dirty(allow_dirty, dry_run)  # bad input: refused before anything is read
    for option, given in (("--s3-bucket", s3_bucket), ("--github-repo", github_repo)):
        if given is not None and not given.strip():
            # An unset workflow variable expands to "": the release would silently skip
            # that target, and a version's published files never change afterwards.
            raise ConfigurationError(
                f"{option} is empty",
                remedy=f"Name it, or leave {option} out to publish without it (in a "
                "workflow: check that the variable it is set from is defined).",
            )
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
        "release_require": None
        if require is None
        else tuple(part.strip() for value in require for part in value.split(",") if part.strip()),
    }
    resolved = settings.with_flags(invocation(ctx).settings, flags)
    targets = release_targets(resolved, __version__, github_draft=github_draft)
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
        required=resolved.release_require,
    )
    with transfer_reporter() as reporter:
        try:
            result = publish(request, targets, reporter)
        except SandboxToolsError as exc:
            # CI sees why in its annotations and on the run's summary page, as it does
            # for build and validate; main() prints the same on stderr.
            actions_error("tools release", exc.message)
            append_step_summary(_failure_summary(exc, dry_run, reporter.coverage))
            raise
    title = f"tools release {result.manifest.version}" + (" (dry run)" if dry_run else "")
    table = Table(title=title)
    for column in ("target", "file", "result"):
        table.add_column(column)
    for (target, name), actions in _actions(reporter.outcomes).items():
        table.add_row(target, name, ", ".join(actions))
    console.print(table)
    # The add-on is optional: whether this release carries it is said every time.
    console.print(addon_summary(result.manifest), highlight=False, markup=False, soft_wrap=True)
    append_step_summary(_summary(result, reporter.outcomes, dry_run))
    if as_json:
        print_json(
            {
                "version": result.manifest.version,
                "dry_run": dry_run,
                "manifest": result.manifest.to_json(),
                "browser_addon": [
                    a.platform for a in result.manifest.of_kind(ArtifactKind.BROWSER)
                ],
                "validated": result.coverage.to_json(),
                "actions": [
                    {"target": target, "file": name, "action": action}
                    for target, name, action in result.actions
                ],
            }
        )
    if dry_run:
        console.print("dry run: nothing was uploaded")
        return
    for note in result.notes:  # e.g. the GitHub release left a draft, and how to publish it
        console.print(note, highlight=False, markup=False, soft_wrap=True)
    if package_dir is not None and (
        result.package_manifest_changed or _uncommitted(tree, package_dir)
    ):
        written = "wrote" if result.package_manifest_changed else "kept (not committed yet)"
        console.print(
            f"{written} {package_dir}/{MANIFEST_FILE}: commit it, so that installs of this "
            "version know which bytes to fetch (tag that commit: see RELEASING.md)"
        )


def _uncommitted(tree: Path | None, path: Path) -> bool:
    """Whether git sees changes under `path` (an unchanged manifest an earlier run wrote
    and nobody committed yet); False when git cannot tell."""
    if tree is None:
        return False
    try:
        status = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(status.strip())


def _actions(outcomes: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
    summary: dict[tuple[str, str], list[str]] = {}
    for target, name, action in outcomes:
        summary.setdefault((target, name), []).append(action)
    return summary


def _summary(
    result: ReleaseResult, outcomes: list[tuple[str, str, str]], dry_run: bool
) -> list[str]:
    """The run's page on GitHub Actions: what was validated, what each target got, and
    the manifest's URLs."""
    verdict = "dry run, nothing uploaded" if dry_run else "published and verified"
    lines = [f"## tools release {result.manifest.version}: {verdict}", ""]
    lines += [*(f"- {note}" for note in result.notes), *([""] if result.notes else [])]
    lines += _coverage_markdown(result.coverage)
    lines += ["", "| target | file | result |", "|---|---|---|"]
    for (target, name), actions in _actions(outcomes).items():
        lines.append(f"| {target} | {name} | {', '.join(actions)} |")
    lines += ["", addon_summary(result.manifest)]
    lines += ["", "| platform | artifact | sha256 | URLs |", "|---|---|---|---|"]
    for artifact in sorted(result.manifest.artifacts, key=lambda a: a.platform):
        urls = "<br>".join(artifact.urls)
        lines.append(f"| {artifact.platform} | {artifact.name} | `{artifact.sha256}` | {urls} |")
    return lines


def _failure_summary(exc: SandboxToolsError, dry_run: bool, coverage: Coverage | None) -> list[str]:
    what = "refused" if exc.exit_code in (2, 11) else "failed"
    lines = [f"## tools release {__version__}{' (dry run)' if dry_run else ''}: {what}", ""]
    lines += ["```", exc.message, "```"]
    if exc.remedy:
        lines += ["", f"What to do: {exc.remedy}"]
    if coverage is not None:
        lines += ["", *_coverage_markdown(coverage)]
    return lines


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
    ctx: typer.Context,
    platform: Annotated[
        list[str] | None,
        typer.Option(
            "--platform",
            metavar="PLATFORM",
            help="linux/amd64, arm64, x86_64, ...; repeatable or a,b (default: all).",
        ),
    ] = None,
    mirror: Annotated[
        list[str] | None,
        typer.Option(metavar="URL", help="Base URL tried before the manifest's (repeatable)."),
    ] = None,
    origin: Annotated[
        Path | None,
        typer.Option(
            "--from",
            metavar="DIR|BUNDLE",
            help="Offline: a directory of artifacts or a bundle tarball.",
        ),
    ] = None,
    manifest_path: Annotated[
        Path | None,
        typer.Option(
            "--manifest",
            metavar="FILE",
            help="Manifest to trust (default: the installed package's).",
        ),
    ] = None,
    dest: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "--dest",
            metavar="DIR",
            help="Directory to place them in (default: the injector's cache). --dest is the "
            "older name.",
        ),
    ] = None,
    with_browser: Annotated[
        bool,
        typer.Option(
            "--with-browser",
            help="Also fetch the optional browser add-on (about 100 MB per platform); bad "
            "input if the release has none for a platform asked for. --from BUNDLE installs "
            "whatever the bundle holds, with or without this flag.",
            metavar="",
        ),
    ] = False,
    verbose_flag: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Name every source tried, in order (as `tools -v fetch`).",
            metavar="",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the outcome as JSON on stdout; the rest on stderr.", metavar=""
        ),
    ] = False,
) -> None:
    """Obtain the manifest's runtimes (and with --with-browser its browser add-ons),
    verified (size and SHA-256), where the injector looks.

    A source that cannot supply an artifact (a mirror refusing, a wrong digest) is named,
    with why, before the next one is tried.
    """
    if as_json:
        humans_to_stderr()
    if verbose_flag:
        raise_verbosity()
    try:
        arches = parse_arches(platform or [])
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    manifest = _trusted_manifest(manifest_path, invocation(ctx).settings, arches, with_browser)
    target_dir = (
        dest if dest is not None else artifact_cache_dir(invocation(ctx).settings, manifest.version)
    )
    _usable_directory(target_dir, "--out")
    platforms = [arch.platform for arch in arches]
    wanted = wanted_artifacts(manifest, platforms, with_browser, origin)
    if verbose():
        for artifact in wanted:
            tried = sources_for(artifact, mirror or [], origin)
            listed = ", ".join(f"{n}. {s.label}" for n, s in enumerate(tried, 1))
            notes.print(
                f"{artifact.name}: sources in order: {listed}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    started = time.monotonic()
    with transfer_reporter() as reporter:
        outcomes = fetch_artifacts(wanted, target_dir, mirror or [], origin, reporter)
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
    skipped = [
        a
        for a in manifest.of_kind(ArtifactKind.BROWSER)
        if a.platform in {w.platform for w in wanted} and a not in wanted
    ]
    lacking = [
        r.platform
        for r in wanted
        if r.kind is ArtifactKind.RUNTIME
        and manifest.find(r.platform, ArtifactKind.BROWSER) is None
    ]
    if with_browser and lacking:
        console.print(
            f"the release carries no browser add-on for {', '.join(lacking)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if skipped:  # said, so that nobody wonders where the browser went
        notes.print(
            f"the release also carries the browser add-on for "
            f"{', '.join(a.platform for a in skipped)} "
            f"({sum(a.size for a in skipped) / 1e6:.0f} MB, optional): --with-browser fetches it",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if as_json:
        print_json(
            {
                "version": manifest.version,
                "dest": str(target_dir),
                "artifacts": [
                    {
                        "platform": o.artifact.platform,
                        "kind": o.artifact.kind.value,
                        "name": o.artifact.name,
                        "path": str(target_dir / o.artifact.name),
                        "sha256": o.artifact.sha256,
                        "result": o.action,
                        "source": o.source,
                    }
                    for o in outcomes
                ],
            }
        )


bundle_app = typer.Typer(help="Carry artifacts into an air-gapped network.", no_args_is_help=True)


def _bundle_target(out: str | None, dist: Path, version: str) -> Path:
    """Like cp: a directory (existing, or named with a trailing /) receives the bundle
    under its usual name, created if need be; anything else is the bundle's file name."""
    if out is None:
        return dist / bundle_name(version)
    path = Path(out)
    if not (out.endswith(("/", os.sep)) or path.is_dir()):
        if path.exists() and not path.is_file():
            raise ConfigurationError(f"--out {out}: not a file or a directory")
        return path
    if path.exists() and not path.is_dir():
        raise ConfigurationError(
            f"--out {out}: {path} is a file, not a directory",
            remedy=f"Give a file name (--out {path}) or another directory.",
        )
    _usable_directory(path, "--out")
    return path / bundle_name(version)


@bundle_app.command("create")
def bundle_create(
    dist: Annotated[Path, typer.Option(metavar="DIR", help="Artifacts and their manifest.")] = Path(
        "dist"
    ),
    manifest_path: Annotated[
        Path | None,
        typer.Option("--manifest", metavar="FILE", help="Default: DIST/manifest.json."),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            metavar="FILE|DIR/",
            help="Bundle file to write, or a directory to write it into (created if it ends "
            "with /). Default: DIST/sandbox-tools-<version>-artifacts.tar.",
        ),
    ] = None,
    with_browser: Annotated[
        bool,
        typer.Option(
            "--with-browser",
            help="Also carry the release's browser add-ons (about 100 MB per platform); bad "
            "input if the release has none.",
            metavar="",
        ),
    ] = False,
) -> None:
    """Write one tarball with the manifest, SHA256SUMS and the runtimes (and with
    --with-browser the browser add-ons)."""
    released = read_manifest(manifest_path or dist / MANIFEST_FILE)
    manifest = bundled_manifest(released, with_browser)
    target = _bundle_target(out, dist, manifest.version)
    try:
        path = create_bundle(dist, manifest, target)
    except OSError as exc:  # the bundle is written whole or not at all (atomic_output)
        raise ConfigurationError(
            f"cannot write {target}: {exc.strerror or exc}",
            remedy="Give --out a file or directory you can write to.",
        ) from None
    addons = [a.platform for a in manifest.of_kind(ArtifactKind.BROWSER)]
    held = f"the browser add-on for {', '.join(addons)}" if addons else "no browser add-on"
    runtimes = "runtime" + ("s" if len(manifest.runtimes) > 1 else "")
    console.print(
        f"wrote {path} ({path.stat().st_size:,} bytes, {len(manifest.artifacts)} artifacts: "
        f"the {runtimes} for {', '.join(a.platform for a in manifest.runtimes)}; {held}); "
        f"offline: `tools fetch --from {path.name}`",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    lacking = [a.platform for a in released.runtimes if a.platform not in addons]
    if with_browser and lacking:
        console.print(
            f"the release carries no browser add-on for {', '.join(lacking)}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    elif not with_browser and released.of_kind(ArtifactKind.BROWSER):
        notes.print(
            "the release also carries a browser add-on: --with-browser bundles it",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def wheel_command(
    dist: Annotated[
        Path, typer.Option(metavar="DIR", help="The released artifacts and build.json.")
    ] = Path("dist"),
    manifest_path: Annotated[
        Path | None,
        typer.Option(
            "--manifest",
            metavar="FILE",
            help="The released manifest the artifacts must match.  \\[default: the one "
            "`tools release` wrote into the checkout, "
            "src/sandbox_tools/release/published/manifest.json]",
        ),
    ] = None,
    out: Annotated[Path, typer.Option(metavar="DIR", help="Directory for the wheel.")] = Path(
        "dist/wheel"
    ),
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
