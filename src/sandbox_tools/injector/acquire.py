"""Selection and acquisition: exactly one verified artifact for a platform.

Where it comes from, in order: bundled in the installed package (wheel installs) ->
the artifact cache, filled by `tools fetch` or fetched now from the released manifest's
mirrors (git-ref installs; only while the sources are the released ones) -> the
checkout's dist/ when its build id matches the current sources -> a local build (an
edited checkout with a reachable Docker engine). Whatever the source, the bytes are
checked against a pinned SHA-256 before they are used.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path

from sandbox_tools import settings
from sandbox_tools._version import __version__
from sandbox_tools.artifacts import Artifact, ArtifactFormat, Provenance, read_build_records
from sandbox_tools.cache import artifact_cache_dir
from sandbox_tools.errors import ConfigurationError, SandboxInjectionError, SandboxToolsError
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import Manifest, packaged_manifest

DEFAULT_FORMAT = ArtifactFormat.PORTABLE


def select_record(records: list[Artifact], arch: Arch, fmt: ArtifactFormat) -> Artifact | None:
    """The one record for (platform, format); more than one is an error, not a choice."""
    matches = [r for r in records if r.arch is arch and r.format is fmt]
    if len(matches) > 1:
        raise SandboxInjectionError(
            f"{len(matches)} artifacts claim {arch.platform} ({fmt.value})",
            remedy="Rebuild the records: exactly one artifact per version and platform.",
        )
    return matches[0] if matches else None


def _manifest_entry(manifest: Manifest | None, arch: Arch) -> Artifact | None:
    if manifest is None or manifest.version != __version__:
        return None
    try:
        return manifest.for_platform(arch.platform)
    except ConfigurationError:
        return None


def _bundled(arch: Arch, fmt: ArtifactFormat, manifest: Manifest | None) -> Artifact | None:
    bundle = resources.files("sandbox_tools") / "_artifacts"
    if not bundle.is_dir():
        return None
    directory = Path(str(bundle))
    record = select_record(read_build_records(directory), arch, fmt)
    if record is None:
        return None
    pinned = _manifest_entry(manifest, arch)
    if pinned is not None and pinned.format is fmt and pinned.sha256 != record.sha256:
        raise SandboxInjectionError(
            f"the bundled {record.name} is not the artifact this version's manifest pins",
            remedy="Reinstall sandbox-tools from a release wheel.",
        )
    return record.found_at(directory / record.name, Provenance.BUNDLED, cache=False)


def _pinned(
    arch: Arch, fmt: ArtifactFormat, manifest: Manifest | None, wanted: str
) -> Artifact | None:
    """The released artifact, from the cache or its mirrors, if it is what the sources say."""
    entry = _manifest_entry(manifest, arch)
    if manifest is None or entry is None or entry.format is not fmt:
        return None
    if entry.build_id != wanted:
        return None  # the runtime sources changed since the release: do not mix versions
    cache = artifact_cache_dir(__version__)
    found = entry.found_at(cache / entry.name, Provenance.CACHE)
    if found is not None:
        return found
    if settings.current().offline or not entry.urls:
        return None
    from sandbox_tools.release.fetch import fetch

    try:
        fetch(manifest, cache, [arch.platform])
    except SandboxToolsError:
        return None  # the checkout may still build it; the final error says what to do
    return replace(entry, path=cache / entry.name, provenance=Provenance.FETCHED)


def checkout_root() -> Path | None:
    """The source checkout this package runs from (editable installs), or None."""
    checkout = Path(__file__).resolve().parents[3]  # src/sandbox_tools/injector -> checkout
    return checkout if (checkout / "pyproject.toml").exists() else None


def checkout_dist() -> Path | None:
    """Where locally built artifacts are: $SANDBOX_TOOLS_DIST, else the checkout's dist/."""
    configured = settings.current().dist
    if configured is not None:
        return configured
    checkout = checkout_root()
    return checkout / "dist" if checkout is not None else None


def current_build_id(arch: Arch, fmt: ArtifactFormat) -> str:
    """The build id the sources would produce now: a local artifact is used only if it matches."""
    from sandbox_tools.build_containers.builder import builder_recipe
    from sandbox_tools.build_containers.records import compute_build_id

    return compute_build_id(arch, fmt, builder_recipe(arch).digest)


def acquire_artifact(arch: Arch, fmt: ArtifactFormat = DEFAULT_FORMAT) -> Artifact:
    """The artifact to inject for `arch`, verified: bundled in the wheel, else built locally
    from these sources, else fetched into the cache (pinned by the released manifest)."""
    manifest = packaged_manifest()
    found = _bundled(arch, fmt, manifest)
    if found is not None:
        return found
    dist = checkout_dist()
    # Hashes the sources, so once per acquisition, and only if something can use it.
    needed = dist is not None or _manifest_entry(manifest, arch) is not None
    wanted = current_build_id(arch, fmt) if needed else ""
    found = _pinned(arch, fmt, manifest, wanted) if needed else None
    if found is not None:
        return found
    if dist is None:
        raise SandboxInjectionError(
            f"no {fmt.value} artifact for {arch.platform} is bundled with this installation "
            "or in its artifact cache",
            remedy="Install a release wheel of sandbox-tools, or run `tools fetch` "
            "(offline: `tools fetch --from BUNDLE`).",
        )
    record = select_record(read_build_records(dist), arch, fmt)
    if record is not None and record.build_id == wanted:
        found = record.found_at(dist / record.name, Provenance.DIST)
        if found is not None:
            return found
    # An edited checkout: build what the sources say (no-op if nothing changed).
    from sandbox_tools.build_containers.build import BuildRequest, NullReporter, build
    from sandbox_tools.sandboxes.engines import local_engine

    try:
        (built,) = build(
            [local_engine()], BuildRequest(arches=(arch,), format=fmt, out_dir=dist), NullReporter()
        )
    except SandboxToolsError as exc:
        raise SandboxInjectionError(
            f"no up-to-date {fmt.value} artifact for {arch.platform} in {dist}, and building "
            f"one failed: {exc.message}",
            remedy=f"Run `tools build --arch {arch.value}` and look at its output.",
        ) from None
    found = built.found_at(dist / built.name, Provenance.BUILT)
    if found is None:
        raise SandboxInjectionError(f"the artifact just built in {dist} does not match its record")
    return found
