"""`tools bundle create`: one tarball to carry the artifacts into an air-gapped network.

It holds the manifest, SHA256SUMS and the artifacts under `sandbox-tools-<version>/`,
uncompressed (the artifacts are compressed already), with fixed owners and times so the
same release always gives the same bytes. The runtimes always; the browser add-ons the
release carries only when asked for (`with_browser`: about 100 MB a platform). The
manifest and SHA256SUMS inside say what the bundle holds, so `sha256sum -c` passes in
it. On the other side `tools fetch --from BUNDLE` installs whatever the bundle holds,
checking every artifact against the manifest the installation trusts, not the bundle's.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from sandbox_tools.artifacts import ArtifactKind, atomic_output
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.release.manifest import (
    MANIFEST_FILE,
    SUMS_FILE,
    Manifest,
    sha256sums,
    verify_local,
)

BUNDLE_MTIME = 0


def bundle_name(version: str) -> str:
    """The air-gap bundle's file name for a version."""
    return f"sandbox-tools-{version}-artifacts.tar"


def _info(name: str, size: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.mtime = BUNDLE_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def bundled_manifest(manifest: Manifest, with_browser: bool = False) -> Manifest:
    """The part of the release a bundle carries: the runtimes, and the browser add-ons
    with `with_browser` (bad input when the release has none)."""
    addons = manifest.of_kind(ArtifactKind.BROWSER)
    if with_browser and not addons:
        raise ConfigurationError(
            f"--with-browser: the release of sandbox-tools {manifest.version} carries no "
            "browser add-on",
            remedy="Bundle without --with-browser: the add-on is optional, and this release "
            "has none (it is built with `tools build --with-browser`).",
        )
    return manifest.only([*manifest.runtimes, *(addons if with_browser else ())])


def create_bundle(dist: Path, manifest: Manifest, out: Path) -> Path:
    """Verify dist/ against the manifest (what the bundle is to hold: `bundled_manifest`),
    then write the bundle atomically."""
    problems = verify_local(dist, manifest)
    if problems:
        raise ConfigurationError(
            "dist does not match the manifest: " + "; ".join(problems),
            remedy="Bundle exactly what was released: `tools fetch` or rebuild, then retry.",
        )
    top = f"sandbox-tools-{manifest.version}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic_output(out) as handle,
        tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        texts = {MANIFEST_FILE: manifest.dumps(), SUMS_FILE: sha256sums(manifest)}
        for name, text in texts.items():
            data = text.encode()
            tar.addfile(_info(f"{top}/{name}", len(data), 0o644), io.BytesIO(data))
        for artifact in sorted(manifest.artifacts, key=lambda a: a.name):
            mode = 0o755 if artifact.kind is ArtifactKind.RUNTIME else 0o644  # add-on: an archive
            with (dist / artifact.name).open("rb") as source:
                tar.addfile(_info(f"{top}/{artifact.name}", artifact.size, mode), source)
    return out


def bundle_manifest(bundle: Path) -> Manifest:
    """The manifest inside a bundle: for display and cross-checks, not a trust anchor."""
    try:
        with tarfile.open(bundle) as tar:
            for member in tar.getmembers():
                if member.isreg() and member.name.split("/")[-1] == MANIFEST_FILE:
                    stream = tar.extractfile(member)
                    assert stream is not None
                    return Manifest.loads(stream.read().decode())
    except (OSError, tarfile.TarError) as exc:
        raise ConfigurationError(f"{bundle} is not a readable bundle: {exc}") from None
    raise ConfigurationError(f"{bundle} holds no {MANIFEST_FILE}")
