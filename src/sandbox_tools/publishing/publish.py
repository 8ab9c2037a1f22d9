"""`tools release`: publish exactly the validated bytes, never change published ones.

The order is what makes a crash harmless: every precondition is checked before
anything is written (the validate report names these bytes, every distribution the
maintainer requires passed in full, and a GitHub release to publish has its tag);
SHA256SUMS and the manifest are written before any upload; every target is compared with
the local bytes before anything is created or uploaded anywhere (identical objects are
skipped, a different one stops the release with nothing created: not even an empty
GitHub draft); artifacts go up before SHA256SUMS and the manifest, so a published manifest
never names a missing artifact; finally every object is downloaded again, as a user
downloads it, and hashed. A run killed anywhere leaves only complete objects with the
right bytes, which the next plain run recognises and skips.

Users download anonymously. An object already published must be downloadable that way
before anything more is uploaded, and each upload is checked before the next: a bucket
users cannot read stops the release after one object, before any manifest names it.

The browser add-on is optional: the add-ons built in dist/ (`tools build --with-browser`)
are released with the runtimes, validated by their static checks, and a release without
any is as valid as one with (`addon_summary` says which platforms have one).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import (
    BUILD_RECORD_FILE,
    ArtifactFormat,
    ArtifactKind,
    artifact_name,
    browser_artifact_name,
    read_build_records,
    sha256_of,
)
from sandbox_tools.errors import (
    ConfigurationError,
    ReleaseFailedError,
    ReleaseRefusedError,
    ReleaseVerificationError,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.publishing.coverage import Coverage, coverage, resolve_required
from sandbox_tools.publishing.targets import PublishConflict, Target, TargetError
from sandbox_tools.release.manifest import (
    MANIFEST_FILE,
    PUBLISHED_DIR,
    SUMS_FILE,
    Manifest,
    manifest_from_records,
    verify_local,
    write_release_files,
)
from sandbox_tools.release.progress import NoProgress, Transfers
from sandbox_tools.validation import ValidationReport

RELEASED_FORMAT = ArtifactFormat.PORTABLE
BUMP = "Bump the version in src/sandbox_tools/_version.py, rebuild, validate and release that."


class ReleaseReporter(Transfers, Protocol):
    def outcome(self, target: str, name: str, action: str) -> None:
        """`action`: would upload, uploaded, skipped (identical), made public-read,
        verified."""

    def validated(self, coverage: Coverage) -> None:
        """What the validate report says about the bytes, once it is read (before any
        refusal over it, and before anything is uploaded)."""


@dataclass(frozen=True)
class ReleaseRequest:
    dist: Path
    validate_report: Path
    checkout: Path | None  # the git tree that must be clean; None: not a checkout
    allow_dirty: bool = False
    dry_run: bool = False
    version: str = __version__
    expected_version: str | None = None  # --version: what the maintainer means to release
    publish_manifest_to: Path | None = None  # the package's published/ dir, to commit
    # Distributions (or prefixes) whose every cell must have passed for every platform.
    required: tuple[str, ...] = ()


@dataclass
class ReleaseResult:
    manifest: Manifest
    files: list[str]
    coverage: Coverage
    actions: list[tuple[str, str, str]] = field(default_factory=list)  # target, name, action
    notes: list[str] = field(default_factory=list)  # where targets stand (a draft left so)
    # The package's published manifest or SHA256SUMS got other bytes (to commit).
    package_manifest_changed: bool = False


# -- preconditions ------------------------------------------------------------------------


def _check_version(request: ReleaseRequest) -> None:
    if request.expected_version is not None and request.expected_version != request.version:
        raise ReleaseRefusedError(
            f"asked to release {request.expected_version}, but the package is {request.version}",
            remedy="Set the version in src/sandbox_tools/_version.py (the one version source).",
        )
    record_file = request.dist / BUILD_RECORD_FILE
    if not record_file.exists():
        raise ReleaseRefusedError(
            f"no build records in {request.dist}", remedy="Run `tools build --all` first."
        )
    built_version = json.loads(record_file.read_text()).get("version")
    if built_version != request.version:
        raise ReleaseRefusedError(
            f"{record_file} was built for version {built_version}, the package is "
            f"{request.version}",
            remedy="Rebuild with `tools build --all`, then `tools validate`.",
        )


def _release_manifest(request: ReleaseRequest, mirrors: Sequence[str]) -> Manifest:
    """Every platform's runtime, and the browser add-on of each platform dist/ has one for."""
    built = read_build_records(request.dist)
    records = [r for r in built if r.kind is ArtifactKind.RUNTIME and r.format is RELEASED_FORMAT]
    addons = [r for r in built if r.kind is ArtifactKind.BROWSER]
    missing = [a.platform for a in Arch if a.platform not in {r.platform for r in records}]
    if missing:
        raise ReleaseRefusedError(
            f"no {RELEASED_FORMAT.value} artifact for {', '.join(missing)} in {request.dist}",
            remedy="A release carries every platform: run `tools build --all`.",
        )
    for record in [*records, *addons]:
        expected = (
            browser_artifact_name(record.arch, request.version)
            if record.kind is ArtifactKind.BROWSER
            else artifact_name(record.arch, RELEASED_FORMAT, request.version)
        )
        if record.name != expected:
            raise ReleaseRefusedError(f"record names {record.name}, expected {expected}")
    manifest = manifest_from_records(request.version, [*records, *addons], mirrors)
    problems = verify_local(request.dist, manifest)
    if problems:
        raise ReleaseRefusedError(
            "the artifacts in dist do not match their build records: " + "; ".join(problems),
            remedy="Rebuild with `tools build --all` (with --with-browser for the browser "
            "add-on) and validate again.",
        )
    return manifest


def addon_summary(manifest: Manifest) -> str:
    """Which platforms the release carries the optional browser add-on for, in one line."""
    have = [a.platform for a in manifest.of_kind(ArtifactKind.BROWSER)]
    lack = [a.platform for a in manifest.runtimes if a.platform not in have]
    if not have:
        return (
            "browser add-on: none in this release (it is optional; `tools build --all "
            "--with-browser` and `tools validate` before releasing add it)"
        )
    if not lack:
        return f"browser add-on: released for {', '.join(have)}"
    return (
        f"browser add-on: released for {', '.join(have)} only, none for {', '.join(lack)} "
        "(a sample there that uses the browser needs a local `tools build --with-browser`)"
    )


def _check_validated(
    request: ReleaseRequest, manifest: Manifest, reporter: ReleaseReporter
) -> Coverage:
    remedy = "Run `tools validate` on these artifacts and release only if every cell passes."
    where = request.validate_report
    required = resolve_required(request.required)  # bad input before anything is read
    try:
        report = ValidationReport.load(where)
    except FileNotFoundError:
        raise ReleaseRefusedError(f"no validation report at {where}", remedy=remedy) from None
    except IsADirectoryError:
        raise ReleaseRefusedError(
            f"{where} is a directory, not a validation report", remedy=remedy
        ) from None
    except OSError as exc:
        raise ReleaseRefusedError(f"cannot read {where}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ReleaseRefusedError(
            f"{where} is not a `tools validate` report: {exc}", remedy=remedy
        ) from None
    for artifact in manifest.artifacts:
        problem = report.problems_for(artifact)
        if problem is not None:
            raise ReleaseRefusedError(f"{where}: {problem}", remedy=remedy)
    found = coverage(report, where, manifest, required)
    reporter.validated(found)
    if found.gaps:
        raise ReleaseRefusedError(
            f"{where}: required distributions were not validated in full:\n  "
            + "\n  ".join(found.gaps),
            remedy=found.gap_remedy(),
        )
    return found


def check_allow_dirty(allow_dirty: bool, dry_run: bool) -> None:
    """Bad input, said before anything is read: a release is made from a committed tree."""
    if allow_dirty and not dry_run:
        raise ConfigurationError(
            "--allow-dirty is only for --dry-run",
            remedy="Commit your changes (a release is made from a committed tree), or add "
            "--dry-run to look without publishing.",
        )


def _check_clean(request: ReleaseRequest) -> None:
    if request.allow_dirty:
        return
    if request.checkout is None:
        raise ReleaseRefusedError(
            "not in a git checkout: cannot tell which commit this release is",
            remedy="Release from a clean clone of the repository.",
        )
    try:
        status = subprocess.run(
            ["git", "-C", str(request.checkout), "status", "--porcelain"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ReleaseRefusedError(
            f"cannot read the git status of {request.checkout}: {exc}",
            remedy="Release from a clean clone of the repository.",
        ) from None
    # The manifest written by an earlier (interrupted) run of this release is expected.
    published = f"sandbox_tools/release/{PUBLISHED_DIR}/"
    dirty = [line for line in status.splitlines() if published not in line]
    if dirty:
        listed = "\n  ".join(dirty[:10]) + ("\n  ..." if len(dirty) > 10 else "")
        raise ReleaseRefusedError(
            f"the working tree {request.checkout} has uncommitted changes:\n  {listed}",
            remedy="Commit or stash them (--allow-dirty exists for --dry-run only).",
        )


# -- publishing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReleaseFile:
    """A file to publish, hashed once for every comparison and verification."""

    path: Path
    size: int
    sha256: str


def _remote_digest(
    target: Target, name: str, advance: Callable[[int], None] = lambda _n: None
) -> str:
    digest = hashlib.sha256()
    for block in target.download(name):
        digest.update(block)
        advance(len(block))
    return digest.hexdigest()


def _compare(
    targets: Sequence[Target], files: dict[str, _ReleaseFile], reporter: ReleaseReporter
) -> dict[str, list[str]]:
    """What each target lacks; refuses the whole release if any object has other bytes."""
    missing: dict[str, list[str]] = {}
    conflicts: list[str] = []
    for target in targets:
        missing[target.label] = []
        for name, local in files.items():
            size = target.remote_size(name)
            if size is None:
                missing[target.label].append(name)
                continue
            remote = _remote_digest(target, name) if size == local.size else None
            if remote == local.sha256:
                reporter.outcome(target.label, name, "skipped (identical)")
                continue
            conflicts.append(
                f"{target.label}/{name}: published "
                + (f"sha256 {remote}" if remote else f"{size:,} bytes")
                + f", local sha256 {local.sha256} ({local.size:,} bytes)"
            )
    if conflicts:
        raise ReleaseRefusedError(
            "published objects have different bytes; published bytes never change:\n  "
            + "\n  ".join(conflicts),
            remedy=BUMP,
        )
    return missing


def publish(
    request: ReleaseRequest,
    targets: Sequence[Target],
    reporter: ReleaseReporter | None = None,
) -> ReleaseResult:
    """Release: refuse unless every precondition holds, upload what is missing, verify every
    object by downloading it again, then make it public. A dry run changes nothing."""
    reporter = reporter or NoProgress()
    if not targets:
        raise ConfigurationError(
            "no release target", remedy="Give --s3-bucket and/or --github-repo."
        )
    check_allow_dirty(request.allow_dirty, request.dry_run)
    _check_version(request)
    manifest = _release_manifest(request, [t.public_base_url for t in targets])
    validated = _check_validated(request, manifest, reporter)
    _check_clean(request)

    # A dry run writes the manifest and SHA256SUMS aside: it changes nothing in dist/.
    scratch = tempfile.TemporaryDirectory(prefix="sandbox-tools-dry-run-")
    release_dir = Path(scratch.name) if request.dry_run else request.dist
    write_release_files(release_dir, manifest)
    # The artifacts were verified against the manifest above; the two small files are
    # hashed here. Artifacts first, the files that point at them last.
    files = {
        a.name: _ReleaseFile(request.dist / a.name, a.size, a.sha256)
        for a in sorted(manifest.artifacts, key=lambda a: a.name)
    }
    for name in (SUMS_FILE, MANIFEST_FILE):
        path = release_dir / name
        files[name] = _ReleaseFile(path, path.stat().st_size, sha256_of(path))
    result = ReleaseResult(manifest=manifest, files=list(files), coverage=validated)

    # Every refusal comes before anything is created or uploaded anywhere: looking is
    # read-only (the GitHub draft is created by its first upload).
    try:
        for target in targets:
            target.prepare()
        for target in targets:
            refused = target.refusal()
            if refused is not None:
                raise refused
        missing = _compare(targets, files, reporter)
        _check_published_access(targets, files, missing, request.dry_run, reporter, result)
    except TargetError as exc:
        raise ReleaseFailedError(
            f"cannot compare with what is published: {exc}",
            # A dry run uploads nothing, now or when run again.
            remedy="Fix the cause above (the network, the target's URL, the credentials) and "
            "run the same dry run again; it changes nothing anywhere."
            if request.dry_run
            else None,
        ) from None

    for target in targets:
        nothing_there = len(missing[target.label]) == len(files)
        if request.dry_run and nothing_there and target.access_remedy():
            reporter.note(
                f"{target.label}: nothing is published there yet, so whether users can "
                "download from it is checked after the first upload of the real run"
            )
        for name in missing[target.label]:
            if request.dry_run:
                reporter.outcome(target.label, name, "would upload")
                result.actions.append((target.label, name, "would upload"))
                continue
            label = f"{target.label}/{name}"
            advance = reporter.start(label, files[name].size)
            try:
                target.upload(name, files[name].path, advance)
            except TargetError as exc:
                raise ReleaseFailedError(f"upload failed: {exc}") from None
            except PublishConflict as exc:
                raise ReleaseRefusedError(
                    f"{exc}: another release is running or just ran",
                    remedy="Run `tools release` again: it compares the bytes and skips or refuses.",
                ) from None
            finally:
                reporter.finish(label)
            reporter.outcome(target.label, name, "uploaded")
            result.actions.append((target.label, name, "uploaded"))
            problem = target.user_access(name)
            if problem is not None:
                raise ReleaseRefusedError(
                    f"{label} was uploaded, but {problem}. The release stops here: nothing "
                    "more is uploaded and no manifest names it",
                    remedy=target.access_remedy(),
                )
    if request.dry_run:
        scratch.cleanup()
        return result
    scratch.cleanup()

    _verify_published(targets, files, reporter, result)
    try:
        for target in targets:
            said = target.finalize()  # a GitHub draft becomes public only now
            if said is not None:
                result.notes.append(said)
    except TargetError as exc:
        raise ReleaseFailedError(f"publishing failed after verification: {exc}") from None
    if request.publish_manifest_to is not None:
        request.publish_manifest_to.mkdir(parents=True, exist_ok=True)
        for name in (MANIFEST_FILE, SUMS_FILE):
            there = request.publish_manifest_to / name
            fresh = (request.dist / name).read_bytes()
            if not there.is_file() or there.read_bytes() != fresh:
                shutil.copyfile(request.dist / name, there)
                result.package_manifest_changed = True
    return result


def _check_published_access(
    targets: Sequence[Target],
    files: dict[str, _ReleaseFile],
    missing: dict[str, list[str]],
    dry_run: bool,
    reporter: ReleaseReporter,
    result: ReleaseResult,
) -> None:
    """What is already published (identical) must be downloadable by users before anything
    more is uploaded: a rerun after "users cannot download it" refuses at once until the
    remedy is in place, or applies it (--s3-public-read) to what is there."""
    unreadable = [
        (target, name, problem)
        for target in targets
        for name in files
        if name not in missing[target.label] and (problem := target.user_access(name)) is not None
    ]
    for target, name, problem in unreadable:  # refused before any grant
        if not target.grants_access:
            raise ReleaseRefusedError(
                f"{target.label}/{name} is published, but {problem}",
                remedy=target.access_remedy(),
            )
    for target, name, _ in unreadable:
        action = "would make public-read" if dry_run else "made public-read"
        if not dry_run:
            target.grant_access(name)
            still = target.user_access(name)
            if still is not None:
                raise ReleaseRefusedError(
                    f"{target.label}/{name}: {still}, even with the public-read ACL",
                    remedy=target.access_remedy(),
                )
        reporter.outcome(target.label, name, action)
        result.actions.append((target.label, name, action))


def _user_digest(
    target: Target, name: str, advance: Callable[[int], None] = lambda _n: None
) -> str:
    digest = hashlib.sha256()
    for block in target.user_download(name):
        digest.update(block)
        advance(len(block))
    return digest.hexdigest()


def _verify_published(
    targets: Sequence[Target],
    files: dict[str, _ReleaseFile],
    reporter: ReleaseReporter,
    result: ReleaseResult,
) -> None:
    """Download every object again, as a user does: what they get is what we validated."""
    failures = []
    for target in targets:
        for name, local in files.items():
            label = f"verify {target.label}/{name}"
            try:
                downloaded = _user_digest(target, name, reporter.start(label, local.size))
            except TargetError as exc:
                failures.append(f"{exc} (while downloading it again)")
                continue
            finally:
                reporter.finish(label)
            if downloaded != local.sha256:
                failures.append(
                    f"{target.label}/{name}: downloaded sha256 {downloaded}, "
                    f"released {local.sha256}"
                )
                continue
            reporter.outcome(target.label, name, "verified")
            result.actions.append((target.label, name, "verified"))
    if failures:
        raise ReleaseVerificationError(
            "published objects do not round-trip:\n  " + "\n  ".join(failures)
        )
