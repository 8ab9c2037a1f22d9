"""Where installs find their artifact: a release wheel (bundled) and git-ref installs (the
artifact cache filled per the packaged manifest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sandbox_tools import __version__
from sandbox_tools.artifacts import sha256_of
from sandbox_tools.cache import artifact_cache_dir
from sandbox_tools.injector import acquire
from sandbox_tools.platforms import Arch
from sandbox_tools.release.fetch import fetch
from sandbox_tools.release.manifest import MANIFEST_FILE, Manifest, read_manifest
from sandbox_tools.settings import load_settings
from tests.release.conftest import FakeRelease, github_target, publish_fake, run_tools, wheel_cli
from tests.release.servers import GitHubReleasesServer

RESOLVE = """
import json, sandbox_tools
from sandbox_tools.injector.acquire import acquire_artifact
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import packaged_manifest

found = {a.value: acquire_artifact(a) for a in Arch}
print(json.dumps({
    "package": sandbox_tools.__file__,
    "manifest": packaged_manifest().to_json(),
    "artifacts": {
        arch: {"path": str(a.path), "sha256": a.sha256, "source": a.provenance.value}
        for arch, a in found.items()
    },
}))
"""


def test_wheel_bundles_both_platforms_and_resolves_offline(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    wrote = run_tools("manifest", "write", "--dist", str(fake_release.dist))
    assert wrote.returncode == 0, wrote.stderr
    manifest = read_manifest(fake_release.dist / MANIFEST_FILE)
    built = wheel_cli(fake_release, tmp_path / "wheel")
    assert built.returncode == 0, built.stderr + built.stdout
    (wheel,) = (tmp_path / "wheel").glob("sandbox_tools-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for artifact in manifest.artifacts:
        assert f"sandbox_tools/_artifacts/{artifact.name}" in names
    assert "sandbox_tools/release/published/manifest.json" in names
    assert "sandbox_tools/release/published/SHA256SUMS" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    offline = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "SANDBOX_TOOLS_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
        "PIP_CONFIG_FILE": os.devnull,
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            str(wheel),
        ],
        check=True,
        env=offline,
    )
    resolved = subprocess.run(
        [str(venv / "bin" / "python"), "-c", RESOLVE],
        capture_output=True,
        text=True,
        env=offline,
        cwd=tmp_path,  # not the checkout: nothing to find in a dist/
    )
    assert resolved.returncode == 0, resolved.stderr
    result = json.loads(resolved.stdout)
    assert result["package"].startswith(str(venv))
    assert Manifest.loads(json.dumps(result["manifest"])) == manifest
    for arch in Arch:
        found = result["artifacts"][arch.value]
        pinned = manifest.for_platform(arch.platform)
        assert found["source"] == "bundled"
        assert found["path"].startswith(str(venv))
        assert found["sha256"] == pinned.sha256 == sha256_of(Path(found["path"]))


def test_the_wheel_never_bundles_the_browser_add_on(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """The add-on (about 100 MB a platform, optional) stays out of the wheel even when
    dist/ holds it and the manifest pins it; the wheel's published manifest still lists
    it, so that an install can fetch it (`tools fetch --with-browser`, or the injector)."""
    addon = fake_release.add_browser(Arch.AMD64)
    wrote = run_tools("manifest", "write", "--dist", str(fake_release.dist))
    assert wrote.returncode == 0, wrote.stderr
    manifest = read_manifest(fake_release.dist / MANIFEST_FILE)
    assert [a.name for a in manifest.addons] == [addon.name]

    built = wheel_cli(fake_release, tmp_path / "wheel")

    assert built.returncode == 0, built.stderr + built.stdout
    (wheel,) = (tmp_path / "wheel").glob("sandbox_tools-*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert not [n for n in names if addon.name in n or n.endswith(".tar.xz")]
    assert wheel.stat().st_size < sum(r.size for r in manifest.runtimes) + 5_000_000
    bundled = "sandbox_tools/_artifacts/"
    assert sorted(n.removeprefix(bundled) for n in names if n.startswith(bundled)) == sorted(
        [*(a.name for a in manifest.runtimes), "build.json", MANIFEST_FILE, "SHA256SUMS"]
    )
    records = json.loads(archive.read(bundled + "build.json"))["artifacts"]
    assert all(r.get("kind", "runtime") == "runtime" for r in records)
    assert addon.name not in archive.read(bundled + "SHA256SUMS").decode()
    published = Manifest.loads(
        archive.read("sandbox_tools/release/published/manifest.json").decode()
    )
    assert published == manifest  # the whole release: the add-on can still be fetched


def test_wheel_refuses_artifacts_that_do_not_match_the_manifest(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    assert run_tools("manifest", "write", "--dist", str(fake_release.dist)).returncode == 0
    fake_release.artifact(Arch.ARM64).write_bytes(b"not what was released")
    built = wheel_cli(fake_release, tmp_path / "wheel")
    assert built.returncode == 2
    assert "do not match the manifest" in built.stderr
    assert not (tmp_path / "wheel").exists() or not list((tmp_path / "wheel").iterdir())


@pytest.fixture
def released_on_github(
    fake_release: FakeRelease, github: GitHubReleasesServer, monkeypatch: pytest.MonkeyPatch
) -> Manifest:
    """A git-ref install: the package carries the released manifest, nothing else."""
    manifest = publish_fake(fake_release, github_target(github))
    monkeypatch.setattr(acquire, "packaged_manifest", lambda: manifest)
    monkeypatch.setenv("SANDBOX_TOOLS_CACHE", str(fake_release.root / "cache"))
    return manifest


def test_injector_fetches_into_the_cache_then_uses_it(
    released_on_github: Manifest, github: GitHubReleasesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDBOX_TOOLS_OFFLINE", raising=False)
    first = acquire.acquire_artifact(Arch.ARM64)
    assert first.provenance == "fetched"
    assert first.path.parent == artifact_cache_dir(load_settings(), __version__)
    assert first.sha256 == released_on_github.for_platform("linux/arm64").sha256

    github.faults.log.clear()
    again = acquire.acquire_artifact(Arch.ARM64)
    assert again.provenance == "cache" and again.path == first.path
    assert github.faults.log == []  # re-verified locally, not downloaded again


def test_offline_injector_uses_what_tools_fetch_placed(
    released_on_github: Manifest, fake_release: FakeRelease, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_TOOLS_OFFLINE", "1")
    fetch(
        released_on_github,
        artifact_cache_dir(load_settings(), __version__),
        origin=fake_release.dist,
    )
    for arch in Arch:
        found = acquire.acquire_artifact(arch)
        assert found.provenance == "cache"
        assert found.sha256 == sha256_of(found.path)


def test_wheel_refuses_a_manifest_missing_a_platform(
    fake_release: FakeRelease, tmp_path: Path
) -> None:
    """The wheel promises every platform offline; one missing failed only later,
    at injection on that platform."""
    assert run_tools("manifest", "write", "--dist", str(fake_release.dist)).returncode == 0
    manifest_file = fake_release.dist / "manifest.json"
    document = json.loads(manifest_file.read_text())
    document["artifacts"] = [a for a in document["artifacts"] if a["platform"] != "linux/arm64"]
    manifest_file.write_text(json.dumps(document))
    built = wheel_cli(fake_release, tmp_path / "wheel")
    assert built.returncode == 2 and "no artifact for linux/arm64" in built.stderr
