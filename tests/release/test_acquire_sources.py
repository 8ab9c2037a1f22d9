"""Acquisition as an ordered list of sources: each says why it could not supply the
artifact, the error lists them all with the one next step that works, and following
that step works (user path: a git-ref install with no published release)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
from pathlib import Path

import pytest

from sandbox_tools import __version__
from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    addon_artifact_name,
    sha256_of,
    write_build_records,
)
from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.acquire import (
    Build,
    Bundled,
    Cache,
    Dist,
    Mirrors,
    Source,
    acquire_addon,
    acquire_artifact,
    current_build_id,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.release.fetch import fetch
from sandbox_tools.release.manifest import Manifest, manifest_from_records
from sandbox_tools.settings import Settings
from tests.release.conftest import FakeRelease


def installed_from_git(
    cache: Path, dist: Path, manifest: Manifest | None, offline: bool
) -> list[Source]:
    """The sources of a package installed from a git URL: no bundle, no checkout."""
    return [
        Bundled(None, manifest),
        Cache(cache, manifest),
        Mirrors(cache, manifest, offline),
        Dist(dist),
        Build(dist, enabled=False, where=Settings()),
    ]


def test_no_release_names_every_source_and_the_step_that_breaks_the_circle(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """User path: `pip install git+URL`, no release for this version. The error used to
    send the user from the injector to `tools fetch` to `tools build` and back."""
    dist = tmp_path / "local-dist"
    sources = installed_from_git(tmp_path / "cache", dist, None, offline=False)
    with pytest.raises(SandboxInjectionError) as failed:
        acquire_artifact(Arch.AMD64, sources=sources)
    message, remedy = failed.value.message, failed.value.remedy or ""
    for name in ("bundled:", "cache:", "fetch:", "dist:", "build:"):
        assert name in message
    assert "no release manifest" in message
    assert f"tools build --arch amd64 --out {dist}" in remedy
    # Following the step: what `tools build --out DIST` writes is what is then used.
    shutil.copytree(fake_release.dist, dist)
    found = acquire_artifact(Arch.AMD64, sources=sources)
    assert found.provenance == "dist" and found.path == dist / found.name


def test_offline_with_a_release_points_at_a_bundle(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    manifest = manifest_from_records(__version__, fake_release.records, ["http://127.0.0.1:9/x"])
    sources = installed_from_git(tmp_path / "cache", tmp_path / "none", manifest, offline=True)
    with pytest.raises(SandboxInjectionError) as failed:
        acquire_artifact(Arch.ARM64, sources=sources)
    assert "offline (SANDBOX_TOOLS_OFFLINE is set)" in failed.value.message
    assert "tools fetch --from BUNDLE" in (failed.value.remedy or "")


class RefusingMirror:
    """A mirror that accepts each connection and closes it at once, counting them."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/x"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                self.connections += 1
                conn.close()


def test_a_dead_mirror_keeps_the_reason_and_is_not_asked_again_at_once(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """An evaluation's samples do not each retry a download that just failed; the
    cheap sources are asked every time (a build made meanwhile is used)."""
    mirror = RefusingMirror()
    manifest = manifest_from_records(__version__, fake_release.records, [mirror.url])
    now = [1000.0]
    dist = tmp_path / "local-dist"
    sources = installed_from_git(tmp_path / "cache", dist, manifest, offline=False)
    sources[2] = Mirrors(tmp_path / "cache", manifest, False, clock=lambda: now[0])
    with pytest.raises(SandboxInjectionError) as first:
        acquire_artifact(Arch.AMD64, sources=sources)
    assert "downloading failed" in first.value.message and mirror.url in first.value.message
    assert "tools fetch" in (first.value.remedy or "")
    tried = mirror.connections
    assert tried >= 1
    now[0] += 5
    with pytest.raises(SandboxInjectionError) as again:
        acquire_artifact(Arch.AMD64, sources=sources)
    assert again.value.message == first.value.message and mirror.connections == tried
    now[0] += 120
    with pytest.raises(SandboxInjectionError):
        acquire_artifact(Arch.AMD64, sources=sources)
    assert mirror.connections > tried
    shutil.copytree(fake_release.dist, dist)
    assert acquire_artifact(Arch.AMD64, sources=sources).provenance == "dist"
    mirror.server.close()


# -- the browser add-on: the same sources, the manifest's browser entry ------------------


def test_the_browser_add_on_is_downloaded_alone_then_taken_from_the_cache(
    published_with_browser: Manifest, tmp_path: Path
) -> None:
    """A git-ref install whose first sample uses the browser: the add-on, and only it, is
    downloaded from the manifest's mirrors into the cache, then used from there."""
    cache = tmp_path / "cache"
    sources = installed_from_git(cache, tmp_path / "none", published_with_browser, offline=False)
    pinned = published_with_browser.for_platform("linux/amd64", ArtifactKind.BROWSER)

    first = acquire_addon(ArtifactKind.BROWSER, Arch.AMD64, sources)

    assert first.provenance == "fetched" and first.kind is ArtifactKind.BROWSER
    assert first.path == cache / pinned.name and sha256_of(first.path) == pinned.sha256
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [pinned.name]
    before = first.path.stat()
    again = acquire_addon(ArtifactKind.BROWSER, Arch.AMD64, sources)
    assert again.provenance == "cache" and again.path == first.path
    assert again.path.stat().st_mtime_ns == before.st_mtime_ns  # not downloaded again


def test_offline_the_add_on_comes_from_what_tools_fetch_with_browser_placed(
    fake_release: FakeRelease, published_with_browser: Manifest, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    sources = installed_from_git(cache, tmp_path / "none", published_with_browser, offline=True)
    with pytest.raises(SandboxInjectionError) as offline:
        acquire_addon(ArtifactKind.BROWSER, Arch.AMD64, sources)
    assert "release wheels never bundle" not in offline.value.message  # not a wheel here
    assert "tools bundle create --with-browser" in (offline.value.remedy or "")

    fetch(
        published_with_browser, cache, ["linux/amd64"], origin=fake_release.dist, with_browser=True
    )

    found = acquire_addon(ArtifactKind.BROWSER, Arch.AMD64, sources)
    assert found.provenance == "cache" and found.kind is ArtifactKind.BROWSER


def test_a_release_without_the_add_on_says_so_and_the_step_it_names_works(
    fake_release: FakeRelease, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The add-on is optional: a release without one for the platform says that, not a
    download failure, and names the build that supplies it."""
    dist = tmp_path / "local-dist"
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(dist))
    manifest = manifest_from_records(__version__, fake_release.records, ["http://127.0.0.1:9/x"])
    wheel = tmp_path / "wheel-artifacts"  # what a release wheel bundles: runtimes only
    wheel.mkdir()
    write_build_records(wheel, fake_release.records)
    sources = installed_from_git(tmp_path / "cache", dist, manifest, offline=False)
    sources[0] = Bundled(wheel, manifest)

    with pytest.raises(SandboxInjectionError) as failed:
        acquire_addon(ArtifactKind.BROWSER, Arch.ARM64, sources)

    message = failed.value.message
    assert message.startswith(f"no browser add-on for linux/arm64 of sandbox-tools {__version__}")
    assert "bundled: release wheels never bundle the browser add-on" in message
    assert "cache: the release carries no browser add-on for linux/arm64" in message
    assert "fetch: the release carries no browser add-on for linux/arm64" in message
    assert "downloading" not in message  # nothing was tried: there is nothing to download
    assert failed.value.remedy == (
        f"Run `tools build --arch arm64 --with-browser --out {dist}`: the injector looks for "
        "local builds there (SANDBOX_TOOLS_DIST names another place)."
    )
    # Following the step: what `tools build --with-browser --out DIST` writes is used.
    fake_release.add_browser(Arch.ARM64)
    shutil.copytree(fake_release.dist, dist)
    found = acquire_addon(ArtifactKind.BROWSER, Arch.ARM64, sources)
    assert found.provenance == "dist" and found.path == dist / found.name


def test_each_add_on_is_taken_by_its_kind_from_a_dist_that_holds_both(tmp_path: Path) -> None:
    """`tools build --with-browser --with-desktop` writes two tar.xz records for one
    platform: each acquisition takes its own kind's, and neither is taken for the other."""
    dist = tmp_path / "dist"
    dist.mkdir()
    records = []
    for kind in (ArtifactKind.BROWSER, ArtifactKind.DESKTOP):
        path = dist / addon_artifact_name(kind, Arch.AMD64)
        path.write_bytes(kind.value.encode() * 100)
        records.append(
            Artifact(
                name=path.name,
                arch=Arch.AMD64,
                format=ArtifactFormat.TAR_XZ,
                kind=kind,
                size=path.stat().st_size,
                sha256=sha256_of(path),
                build_id=current_build_id(Arch.AMD64, ArtifactFormat.TAR_XZ, kind),
            )
        )
    write_build_records(dist, records)
    for kind in (ArtifactKind.BROWSER, ArtifactKind.DESKTOP):
        found = acquire_addon(kind, Arch.AMD64, [Dist(dist)])
        assert found.kind is kind and found.path == dist / addon_artifact_name(kind, Arch.AMD64)
    with pytest.raises(ValueError, match=r"no runtime artifact is tar\.xz"):
        acquire_artifact(Arch.AMD64, ArtifactFormat.TAR_XZ, [Dist(dist)])
