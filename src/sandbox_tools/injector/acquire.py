"""Selection and acquisition: exactly one verified artifact for a platform.

Acquisition asks an ordered list of sources, and the first that can supply the
artifact wins: bundled in the installed package (wheel installs) -> the artifact cache,
filled by `tools fetch` -> the released manifest's mirrors, fetched now (git-ref
installs of the released sources) -> a local dist/ whose build id matches the current
sources -> a local build (an edited checkout with a reachable Docker engine). Each
source that cannot supply it says why, and when none can, the error lists every
reason and the one next step that works. Whatever the source, the bytes are checked
against a pinned SHA-256 before they are used.

The sources are objects passed in (`acquire_artifact(arch, sources=...)`);
`default_sources()` is the list an installation gets from its settings.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Protocol

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import (
    RUNTIME_FORMATS,
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    Provenance,
    read_build_records,
)
from sandbox_tools.cache import artifact_cache_dir, cache_root
from sandbox_tools.errors import SandboxInjectionError, SandboxToolsError
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import Manifest, packaged_manifest
from sandbox_tools.settings import Settings, load_settings

DEFAULT_FORMAT = ArtifactFormat.PORTABLE

log = logging.getLogger(__name__)


class Need:
    """What is wanted: a platform, a kind (the runtime or an add-on) and format, and the
    build id the sources would make now (hashing the sources is computed once, and only
    if a source asks; a caller that computed it already for this need passes it in)."""

    def __init__(
        self,
        arch: Arch,
        fmt: ArtifactFormat,
        build_id: str | None = None,
        kind: ArtifactKind = ArtifactKind.RUNTIME,
    ) -> None:
        if (kind is ArtifactKind.RUNTIME) != (fmt in RUNTIME_FORMATS):
            raise ValueError(f"no {kind.value} artifact is {fmt.value}")
        self.arch = arch
        self.fmt = fmt
        self.kind = kind
        if build_id is not None:
            self.__dict__["build_id"] = build_id  # the cached property's value

    @functools.cached_property
    def build_id(self) -> str:
        return current_build_id(self.arch, self.fmt, self.kind)

    @property
    def addon(self) -> bool:
        """An add-on rather than the runtime."""
        return self.kind is not ArtifactKind.RUNTIME

    @property
    def flag(self) -> str:
        """What `tools build`, `fetch` and `bundle create` are told to take the add-on."""
        return f" --with-{self.kind.value}" if self.addon else ""

    def __str__(self) -> str:
        if self.addon:
            return f"the {self.kind.value} add-on for {self.arch.platform}"
        return f"the {self.fmt.value} artifact for {self.arch.platform}"


class Unavailable(Exception):
    """A source cannot supply the artifact: why (one clause), and the step that would
    let it, when this source knows one."""

    def __init__(self, why: str, step: str | None = None) -> None:
        super().__init__(why)
        self.step = step


class Source(Protocol):
    @property
    def name(self) -> str:
        """How the error lists it: "bundled", "cache", ..."""
        ...

    def supply(self, need: Need) -> Artifact:
        """The artifact, verified and located on this machine; raises Unavailable."""
        ...


def select_record(
    records: list[Artifact],
    arch: Arch,
    fmt: ArtifactFormat,
    kind: ArtifactKind = ArtifactKind.RUNTIME,
) -> Artifact | None:
    """The one record for (platform, format, kind); more than one is an error, not a
    choice."""
    matches = [r for r in records if r.arch is arch and r.format is fmt and r.kind is kind]
    if len(matches) > 1:
        raise SandboxInjectionError(
            f"{len(matches)} artifacts claim {arch.platform} ({fmt.value})",
            remedy="Rebuild the records: exactly one artifact per version and platform.",
        )
    return matches[0] if matches else None


def _released(manifest: Manifest | None, need: Need) -> Artifact:
    """This version's released artifact for `need` (the runtime, or an add-on: the
    manifest's entry of that kind), if its sources are these."""
    if manifest is None:
        raise Unavailable("this installation carries no release manifest")
    if manifest.version != __version__:
        raise Unavailable(f"the manifest is for {manifest.version}, not {__version__}")
    entry = manifest.find(need.arch.platform, need.kind)
    if entry is None and need.addon:
        # The add-on is optional: a release may carry none, for this platform or any. The
        # local dist source, asked after this one, says where to build it.
        raise Unavailable(
            f"the release carries no {need.kind.value} add-on for {need.arch.platform}"
        )
    if entry is None:
        raise Unavailable(f"the release has no artifact for {need.arch.platform}")
    if entry.format is not need.fmt:
        raise Unavailable(f"the release's artifact is {entry.format.value}, not {need.fmt.value}")
    if entry.build_id != need.build_id:
        # The sources changed since the release: never mix versions.
        what = f"{need.kind.value} add-on's" if need.addon else "runtime"
        raise Unavailable(f"the {what} sources differ from the released ones")
    return entry


@dataclass(frozen=True)
class Bundled:
    """Inside the installed package (release wheels carry every platform)."""

    directory: Path | None
    manifest: Manifest | None
    name: str = "bundled"

    def supply(self, need: Need) -> Artifact:
        if self.directory is None or not self.directory.is_dir():
            raise Unavailable("this installation is not a release wheel (no bundled artifacts)")
        record = select_record(read_build_records(self.directory), need.arch, need.fmt, need.kind)
        if record is None and need.addon:
            raise Unavailable(f"release wheels never bundle the {need.kind.value} add-on")
        if record is None:
            raise Unavailable(f"the wheel bundles no {need.fmt.value} artifact for this platform")
        pinned = None
        if self.manifest is not None and self.manifest.version == __version__:
            pinned = self.manifest.find(need.arch.platform, need.kind)
        if pinned is not None and pinned.format is need.fmt and pinned.sha256 != record.sha256:
            raise SandboxInjectionError(
                f"the bundled {record.name} is not the artifact this version's manifest pins",
                remedy="Reinstall sandbox-tools from a release wheel.",
            )
        found = record.found_at(self.directory / record.name, Provenance.BUNDLED, cache=False)
        if found is None:
            raise Unavailable(f"the bundled {record.name} does not match its record")
        return found


@dataclass(frozen=True)
class Cache:
    """The released artifact, placed in the artifact cache by `tools fetch` (or earlier)."""

    directory: Path
    manifest: Manifest | None
    name: str = "cache"

    def supply(self, need: Need) -> Artifact:
        entry = _released(self.manifest, need)
        found = entry.found_at(self.directory / entry.name, Provenance.CACHE)
        if found is None:
            raise Unavailable(f"{entry.name} is not in {self.directory}")
        return found


# A failed download is remembered briefly, so that the samples of an evaluation fail at
# once with the same reason instead of each taking the fetch's retries again (behind a
# dead proxy that is most of a minute per sample). The cheap sources are always asked.
FAILURE_MEMORY = 60.0
_download_failures: dict[tuple[str, ...], tuple[float, Unavailable]] = {}


@dataclass(frozen=True)
class Mirrors:
    """The released artifact, downloaded now from the manifest's mirrors into the cache."""

    directory: Path
    manifest: Manifest | None
    offline: bool
    name: str = "fetch"
    clock: Callable[[], float] = time.monotonic

    def supply(self, need: Need) -> Artifact:
        entry = _released(self.manifest, need)
        addon = need.flag
        if self.offline:
            raise Unavailable(
                "offline (SANDBOX_TOOLS_OFFLINE is set)",
                "Run `tools fetch --from BUNDLE` with a bundle made by "
                f"`tools bundle create{addon}`, or unset SANDBOX_TOOLS_OFFLINE so the release "
                "can be downloaded.",
            )
        if not entry.urls or self.manifest is None:
            raise Unavailable("the manifest lists no mirrors")
        from sandbox_tools.release.fetch import fetch_artifacts

        key = (str(self.directory), *entry.urls)
        remembered = _download_failures.get(key)
        if remembered is not None and self.clock() - remembered[0] < FAILURE_MEMORY:
            raise remembered[1]
        try:
            # Just this artifact: a sample that needs the runtime does not wait for the
            # add-on's 100 MB, nor one that needs the add-on for the runtime.
            fetch_artifacts([entry], self.directory)
        except SandboxToolsError as exc:
            failed = Unavailable(
                f"downloading failed: {exc.message}",
                f"Run `tools fetch --platform {need.arch.platform}{addon}` where the mirrors "
                f"are reachable (it shows each attempt), or `tools fetch --from BUNDLE{addon}` "
                "offline.",
            )
            _download_failures[key] = (self.clock(), failed)
            raise failed from None
        _download_failures.pop(key, None)
        return replace(entry, path=self.directory / entry.name, provenance=Provenance.FETCHED)


@dataclass(frozen=True)
class Dist:
    """A local dist/ (what `tools build` wrote), used only if it matches the sources."""

    directory: Path
    name: str = "dist"

    def supply(self, need: Need) -> Artifact:
        step = (
            f"Run `tools build --arch {need.arch.value}{need.flag} --out {self.directory}`: "
            "the injector looks for local builds there (SANDBOX_TOOLS_DIST names another "
            "place)."
            + ("" if need.addon else " Add --with-browser if the task uses the web browser.")
        )
        records = read_build_records(self.directory)
        record = select_record(records, need.arch, need.fmt, need.kind)
        if record is None:
            what = f"{need.kind.value} add-on" if need.addon else "build"
            raise Unavailable(f"{self.directory} holds no {what} for this platform", step)
        if record.build_id != need.build_id:
            raise Unavailable(f"{self.directory}/{record.name} was built from other sources", step)
        found = record.found_at(self.directory / record.name, Provenance.DIST)
        if found is None:
            raise Unavailable(f"{self.directory}/{record.name} does not match its record", step)
        return found


@dataclass(frozen=True)
class Build:
    """Build from this source checkout now (an edited checkout with a Docker engine).

    Announced before it starts: it takes ~20 s warm and minutes cold, inside the first
    tool call of a sample."""

    directory: Path
    enabled: bool
    where: Settings  # the Debian mirror and the cache the build uses
    name: str = "build"

    def supply(self, need: Need) -> Artifact:
        if not self.enabled:
            raise Unavailable("only a source checkout builds on demand")
        from sandbox_tools.build_containers.build import BuildRequest, NullReporter, build
        from sandbox_tools.sandboxes.containers import ContainerPolicy
        from sandbox_tools.sandboxes.engines import local_engine
        from sandbox_tools.sandboxes.images import RootfsStore

        log.warning(
            "building %s from this checkout into %s (no up-to-date artifact elsewhere); "
            "this takes %s",
            need,
            self.directory,
            "about a minute with a warm cache, 4 to 7 minutes on a cold machine"
            if need.addon
            else "about 20 s with warm builder images, minutes on a cold machine",
        )
        started = time.monotonic()
        try:
            records = build(
                [local_engine(self.where.engine_concurrency)],
                BuildRequest(
                    arches=(need.arch,),
                    # The add-on is built beside a runtime (of the default format).
                    format=DEFAULT_FORMAT if need.addon else need.fmt,
                    out_dir=self.directory,
                    roots=RootfsStore.of(self.where),
                    containers=ContainerPolicy.of(self.where),
                    addons=(need.kind,) if need.addon else (),
                ),
                NullReporter(),
            )
        except SandboxToolsError as exc:
            raise Unavailable(f"building failed: {exc.message}") from None
        (built,) = [r for r in records if r.format is need.fmt and r.kind is need.kind]
        found = built.found_at(self.directory / built.name, Provenance.BUILT)
        if found is None:
            raise Unavailable(f"the artifact just built in {self.directory} does not match")
        log.info("built %s in %.1f s", built.name, time.monotonic() - started)
        return found


def checkout_root() -> Path | None:
    """The source checkout this package runs from (editable installs), or None."""
    checkout = Path(__file__).resolve().parents[3]  # src/sandbox_tools/injector -> checkout
    return checkout if (checkout / "pyproject.toml").exists() else None


def local_dist(where: Settings) -> Path:
    """Where locally built artifacts are looked for: the `dist` setting, else the
    checkout's dist/, else (an installed package) `<cache root>/dist`."""
    if where.dist is not None:
        return where.dist
    checkout = checkout_root()
    return checkout / "dist" if checkout is not None else cache_root(where) / "dist"


def current_build_id(
    arch: Arch, fmt: ArtifactFormat, kind: ArtifactKind = ArtifactKind.RUNTIME
) -> str:
    """The build id the sources would produce now: a local artifact is used only if it
    matches."""
    from sandbox_tools.build_containers.records import (
        addon_build_id,
        builder_recipe,
        compute_build_id,
    )

    if kind is not ArtifactKind.RUNTIME:
        return addon_build_id(kind, arch)
    return compute_build_id(arch, fmt, builder_recipe(arch).digest)


def default_sources(where: Settings) -> list[Source]:
    """The sources this installation has under the given settings, in order of preference."""
    manifest = packaged_manifest()
    bundle = resources.files("sandbox_tools") / "_artifacts"
    cache = artifact_cache_dir(where, __version__)
    dist = local_dist(where)
    return [
        Bundled(Path(str(bundle)) if bundle.is_dir() else None, manifest),
        Cache(cache, manifest),
        Mirrors(cache, manifest, where.offline),
        Dist(dist),
        Build(dist, enabled=checkout_root() is not None, where=where),
    ]


def acquire_artifact(
    arch: Arch,
    fmt: ArtifactFormat = DEFAULT_FORMAT,
    sources: Sequence[Source] | None = None,
    build_id: str | None = None,
    kind: ArtifactKind = ArtifactKind.RUNTIME,
) -> Artifact:
    """The artifact to inject for `arch` (the runtime of `fmt`, or the add-on `kind`:
    `acquire_addon`), verified, from the first source that has it (`sources`, else this
    installation's under the settings as they stand now: this is a library entry point).
    `build_id`: `current_build_id(arch, fmt, kind)` where the caller has it already
    (hashing the sources again costs milliseconds per injection)."""
    chosen = default_sources(load_settings()) if sources is None else sources
    need = Need(arch, fmt, build_id, kind)
    reasons: dict[str, str] = {}
    steps: list[str] = []
    for source in chosen:
        try:
            found = source.supply(need)
        except Unavailable as why:
            reasons[source.name] = str(why)
            steps += [why.step] if why.step else []
            log.debug("%s: %s: %s", need, source.name, why)
            continue
        log.info("%s: %s (%s, %s)", need, found.name, found.path, source.name)
        return found
    listed = "; ".join(f"{name}: {why}" for name, why in reasons.items())
    error = SandboxInjectionError(
        f"no {f'{kind.value} add-on' if need.addon else f'{fmt.value} artifact'} for "
        f"{arch.platform} of sandbox-tools {__version__} ({listed})",
        # The most preferred source that knows how it could supply it says what to do.
        remedy=steps[0] if steps else "Install a release wheel of sandbox-tools.",
    )
    raise error


def acquire_addon(
    kind: ArtifactKind, arch: Arch, sources: Sequence[Source] | None = None
) -> Artifact:
    """The add-on `kind` for `arch`, as `acquire_artifact` finds the runtime."""
    return acquire_artifact(arch, ArtifactFormat.TAR_XZ, sources, kind=kind)


def present_artifact(
    arch: Arch,
    fmt: ArtifactFormat,
    sources: Sequence[Source] | None = None,
    build_id: str | None = None,
    kind: ArtifactKind = ArtifactKind.RUNTIME,
) -> Artifact:
    """`acquire_artifact` from the sources that need no download and no build (the
    wheel's, the cache's, dist/): for work that only pays off if the artifact is here
    already. SandboxInjectionError when none has it."""
    chosen = default_sources(load_settings()) if sources is None else sources
    return acquire_artifact(
        arch,
        fmt,
        [source for source in chosen if isinstance(source, (Bundled, Cache, Dist))],
        build_id,
        kind,
    )
