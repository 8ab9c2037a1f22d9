"""`tools fetch` and bundles: real HTTP from moto's S3 and the GitHub server, real files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_tools import __version__
from sandbox_tools.artifacts import ArtifactKind, sha256_of
from sandbox_tools.errors import ConfigurationError, FetchError
from sandbox_tools.release.fetch import fetch
from sandbox_tools.release.manifest import MANIFEST_FILE, Manifest, packaged_manifest
from tests.release.conftest import (
    GITHUB_REPO,
    FakeRelease,
    S3Server,
    run_tools,
    tools_env,
)
from tests.release.servers import FaultProxy, GitHubReleasesServer

TAG = f"v{__version__}"


def fetch_cli(release: FakeRelease, dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tools(
        "fetch", "--manifest", str(release.dist / MANIFEST_FILE), "--dest", str(dest), *args
    )


def reported(result: subprocess.CompletedProcess[str], action: str) -> list[str]:
    """`<platform>/<artifact>: <action> ...` lines the fetch printed (not the table)."""
    return [
        line
        for line in result.stdout.splitlines()
        if line.startswith("linux/") and line.split(": ", 1)[-1].startswith(action)
    ]


def assert_holds_exactly(dest: Path, manifest: Manifest) -> None:
    """Every artifact verified, and nothing else but the digest cache (no partial files);
    runtimes executable, add-ons (archives) not."""
    for artifact in manifest.artifacts:
        assert sha256_of(dest / artifact.name) == artifact.sha256
        runtime = artifact.kind is ArtifactKind.RUNTIME
        assert os.access(dest / artifact.name, os.X_OK) == runtime
    names = {p.name for p in dest.iterdir()} - {".sandbox-tools-digests.json"}
    assert names == {a.name for a in manifest.artifacts}


def test_fetch_from_the_s3_url_then_reverify(
    fake_release: FakeRelease, published: Manifest, s3: S3Server, tmp_path: Path
) -> None:
    dest = tmp_path / "cache"
    result = fetch_cli(fake_release, dest)
    assert result.returncode == 0, result.stderr
    fetched = reported(result, "fetched from")
    assert len(fetched) == 2
    assert all(f"from {s3.endpoint}/{s3.bucket}/releases/" in line for line in fetched)
    assert_holds_exactly(dest, published)

    again = fetch_cli(fake_release, dest, "--json")  # stdout: the outcome as JSON only
    assert again.returncode == 0, again.stderr
    document = json.loads(again.stdout)
    assert [a["result"] for a in document["artifacts"]] == ["present", "present"]
    assert {a["sha256"] for a in document["artifacts"]} == {a.sha256 for a in published.artifacts}


def test_fetch_from_the_github_url(
    fake_release: FakeRelease, published: Manifest, github: GitHubReleasesServer, tmp_path: Path
) -> None:
    dest = tmp_path / "cache"
    base = f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}"
    result = fetch_cli(fake_release, dest, "--mirror", base, "--platform", "arm64")
    assert result.returncode == 0, result.stderr
    arm64 = published.for_platform("linux/arm64")
    assert [line for line in github.faults.log if "/releases/download/" in line] == [
        f"GET /{GITHUB_REPO}/releases/download/{TAG}/{arm64.name} "
    ]
    assert [p.name for p in dest.iterdir() if not p.name.startswith(".")] == [arm64.name]
    assert sha256_of(dest / arm64.name) == arm64.sha256


def test_fetch_from_a_directory_and_from_a_bundle(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    bundle = tmp_path / "carry" / "artifacts.tar"
    made = run_tools("bundle", "create", "--dist", str(fake_release.dist), "--out", str(bundle))
    assert made.returncode == 0, made.stderr
    first = hashlib.sha256(bundle.read_bytes()).hexdigest()
    run_tools("bundle", "create", "--dist", str(fake_release.dist), "--out", str(bundle))
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() == first  # reproducible

    offline = tools_env(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    for origin, dest in ((bundle, tmp_path / "from-bundle"), (fake_release.dist, tmp_path / "d")):
        result = run_tools(
            "fetch",
            "--manifest",
            str(fake_release.dist / MANIFEST_FILE),
            "--from",
            str(origin),
            "--dest",
            str(dest),
            env=offline,
        )
        assert result.returncode == 0, result.stderr
        assert_holds_exactly(dest, published)


def test_a_bundle_cannot_smuggle_other_bytes(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    bundle = tmp_path / "artifacts.tar"
    assert run_tools("bundle", "create", "--dist", str(fake_release.dist), "--out", str(bundle))
    amd64 = published.for_platform("linux/amd64")
    data = bytearray(bundle.read_bytes())
    offset = data.find((fake_release.dist / amd64.name).read_bytes()[:4096])
    data[offset + 100] ^= 0xFF  # one byte of the artifact inside the tarball
    bundle.write_bytes(bytes(data))
    dest = tmp_path / "dest"
    with pytest.raises(FetchError) as caught:
        fetch(published, dest, ["linux/amd64"], origin=bundle)
    assert f"the manifest pins {amd64.sha256}" in caught.value.message
    assert list(dest.iterdir()) == []


def test_digest_mismatch_leaves_nothing_and_names_url_and_digests(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    manifest_file = fake_release.dist / MANIFEST_FILE
    pinned = "0" * 64
    amd64 = published.for_platform("linux/amd64")
    manifest_file.write_text(manifest_file.read_text().replace(amd64.sha256, pinned))
    dest = tmp_path / "cache"

    result = fetch_cli(fake_release, dest, "--platform", "linux/amd64")

    assert result.returncode == 13, result.stderr
    for url in amd64.urls:  # every mirror was tried, each failure is reported
        assert f"{url}: sha256 {amd64.sha256}, the manifest pins {pinned}" in result.stderr
    assert list(dest.iterdir()) == []


def test_truncated_transfer_resumes_with_a_range_request(
    fake_release: FakeRelease, published: Manifest, github: GitHubReleasesServer, tmp_path: Path
) -> None:
    arm64 = published.for_platform("linux/arm64")
    github.faults.truncate[arm64.name] = [150_000, 150_000]  # cut twice, then whole
    base = f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}"
    dest = tmp_path / "cache"

    outcome = fetch(published, dest, ["linux/arm64"], mirrors=[base])

    assert outcome[0].action == "fetched" and outcome[0].source.startswith(base)
    assert sha256_of(dest / arm64.name) == arm64.sha256
    requests = [line.split() for line in github.faults.log if arm64.name in line]
    offsets = [int(r[-1].removeprefix("bytes=").rstrip("-")) for r in requests if len(r) == 3]
    # Two resumes, each from the bytes already on disk (whole chunks), never from zero.
    assert len(requests) == 3 and len(offsets) == 2
    assert 0 < offsets[0] <= 150_000 and offsets[0] < offsets[1] <= offsets[0] + 150_000


def test_truncated_s3_transfer_resumes(
    fake_release: FakeRelease,
    published: Manifest,
    s3: S3Server,
    s3_proxy: FaultProxy,
    tmp_path: Path,
) -> None:
    amd64 = published.for_platform("linux/amd64")
    s3_proxy.faults.truncate[amd64.name] = [200_000]
    mirror = f"{s3_proxy.url}/{s3.bucket}/releases/{__version__}"
    dest = tmp_path / "cache"

    fetch(published, dest, ["linux/amd64"], mirrors=[mirror])

    assert sha256_of(dest / amd64.name) == amd64.sha256
    (resumed,) = [line for line in s3_proxy.faults.log if "Range" in line or "bytes=" in line]
    assert 0 < int(resumed.split("bytes=")[1].rstrip("-")) <= 200_000


def test_a_transfer_that_never_completes_fails_cleanly(
    fake_release: FakeRelease, published: Manifest, github: GitHubReleasesServer, tmp_path: Path
) -> None:
    arm64 = published.for_platform("linux/arm64")
    github.faults.truncate[arm64.name] = [1_000] * 50
    base = f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}"
    dest = tmp_path / "cache"
    only_github = Manifest(
        version=published.version,
        artifacts=tuple(replace(a, urls=()) if a is arm64 else a for a in published.artifacts),
    )

    with pytest.raises(FetchError) as caught:
        fetch(only_github, dest, ["linux/arm64"], mirrors=[base])

    assert f"{base}/{arm64.name}: transfer stopped at 0 of" in caught.value.message
    # It answered each time, so it was asked again; in words, not urllib3's.
    assert "after 5 attempts (the connection closed early)" in caught.value.message
    assert "IncompleteRead" not in caught.value.message
    assert list(dest.iterdir()) == []


def test_concurrent_fetches_share_one_download(
    fake_release: FakeRelease, published: Manifest, github: GitHubReleasesServer, tmp_path: Path
) -> None:
    dest = tmp_path / "cache"
    base = f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}"
    command = [
        sys.executable,
        "-m",
        "sandbox_tools.cli",
        "fetch",
        "--manifest",
        str(fake_release.dist / MANIFEST_FILE),
        "--dest",
        str(dest),
        "--mirror",
        base,
    ]
    processes = [
        subprocess.Popen(command, env=tools_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), p.communicate()) for p in processes]

    assert all(code == 0 for code, _ in results), results
    assert_holds_exactly(dest, published)
    for artifact in published.artifacts:
        downloads = [
            line for line in github.faults.log if f"download/{TAG}/{artifact.name}" in line
        ]
        assert len(downloads) == 1  # the others waited on the lock, then re-verified


def test_a_tampered_artifact_in_place_is_replaced(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    dest = tmp_path / "cache"
    fetch(published, dest)
    amd64 = published.for_platform("linux/amd64")
    path = dest / amd64.name
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size, same mtime

    outcomes = {o.artifact.platform: o.action for o in fetch(published, dest)}

    assert outcomes == {"linux/amd64": "replaced", "linux/arm64": "present"}
    assert sha256_of(path) == amd64.sha256


def test_without_a_released_manifest_fetch_says_what_to_do(tmp_path: Path) -> None:
    if packaged_manifest() is not None:
        pytest.skip("this checkout carries a released manifest")
    result = run_tools("fetch", "--dest", str(tmp_path))
    assert result.returncode == 2
    assert "carries no released manifest" in result.stderr
    assert "--manifest FILE" in result.stderr


def test_fetch_says_which_mirror_refused_and_why_before_falling_back(
    fake_release: FakeRelease, published: Manifest, s3: S3Server, tmp_path: Path
) -> None:
    """Finding 2: the S3 mirror refusing anonymous downloads fell back to GitHub in silence."""
    client = s3.client()
    amd64 = published.for_platform("linux/amd64")
    client.delete_bucket_policy(Bucket=s3.bucket)  # type: ignore[attr-defined]
    key = f"releases/{__version__}/{amd64.name}"
    client.put_object_acl(Bucket=s3.bucket, Key=key, ACL="private")  # type: ignore[attr-defined]
    s3_url, github_url = amd64.urls

    result = fetch_cli(fake_release, tmp_path / "cache", "--platform", "amd64", "-v")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    plan = f"{amd64.name}: sources in order: 1. {s3_url}, 2. {github_url}"
    refused = next(line for line in lines if line.startswith(f"{amd64.name}: {s3_url}: "))
    assert (
        refused.lower()
        == (
            f"{amd64.name}: {s3_url}: HTTP 403 Forbidden (the mirror refuses anonymous downloads); "
            f"trying {github_url}"
        ).lower()
    )
    fetched = f"linux/amd64/{amd64.name}: fetched from {github_url}"
    assert plan in lines and fetched in lines, result.stdout
    assert lines.index(plan) < lines.index(refused) < lines.index(fetched)
    # Without -v the refusal is still said (only the plan is verbose), and so is each source
    # before it is tried; --quiet drops all of it; --json moves it to stderr.
    plain = fetch_cli(fake_release, tmp_path / "again", "--platform", "amd64")
    assert refused in plain.stdout.splitlines() and plan not in plain.stdout
    trying = f"{amd64.name}: trying {s3_url}"
    assert plain.stdout.splitlines()[0] == trying, plain.stdout
    as_json = fetch_cli(fake_release, tmp_path / "as-json", "--platform", "amd64", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["artifacts"][0]["result"] == "fetched"
    assert trying in as_json.stderr.splitlines() and refused in as_json.stderr.splitlines()
    hushed = run_tools(
        "--quiet",
        "fetch",
        "--manifest",
        str(fake_release.dist / MANIFEST_FILE),
        "--out",
        str(tmp_path / "hushed"),
        "--platform",
        "amd64",
    )
    assert hushed.returncode == 0 and "trying" not in hushed.stdout + hushed.stderr


def test_fetch_from_a_file_that_is_not_a_bundle(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    """Finding 7: `--from README.md` printed tarfile's "ReadError('invalid header')"."""
    readme = tmp_path / "README.md"
    readme.write_text("# not a bundle\n")
    dest = tmp_path / "dest"
    for json_flag in ([], ["--json"]):
        result = run_tools(
            "fetch",
            "--manifest",
            str(fake_release.dist / MANIFEST_FILE),
            "--from",
            str(readme),
            "--out",
            str(dest),
            *json_flag,
        )
        assert result.returncode == 2, result.stderr
        assert f"--from {readme} is not a bundle (not a tar archive)" in result.stderr
        assert "tools bundle create" in result.stderr
        for internal in ("ReadError", "invalid header", "method gz", "Traceback"):
            assert internal not in result.stderr + result.stdout
        if json_flag:
            document = json.loads(result.stdout)
            assert document["exit_code"] == 2 and "is not a bundle" in document["error"]
    assert list(dest.iterdir()) == []


def test_a_tampered_bundle_is_refused_with_a_remedy_other_than_the_bundle(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    """Finding 7: after `tools fetch --from BUNDLE` refused a tampered bundle, the remedy
    said "use `tools fetch --from BUNDLE`", the thing just done."""
    bundle = tmp_path / "artifacts.tar"
    made = run_tools("bundle", "create", "--dist", str(fake_release.dist), "--out", str(bundle))
    assert made.returncode == 0, made.stderr
    amd64 = published.for_platform("linux/amd64")
    data = bytearray(bundle.read_bytes())
    data[data.find((fake_release.dist / amd64.name).read_bytes()[:4096]) + 100] ^= 0xFF
    bundle.write_bytes(bytes(data))
    dest = tmp_path / "dest"

    result = run_tools(
        "fetch",
        "--manifest",
        str(fake_release.dist / MANIFEST_FILE),
        "--from",
        str(bundle),
        "--out",
        str(dest),
        "--platform",
        "amd64",
    )

    assert result.returncode == 13, result.stderr
    error = " ".join(result.stderr.split())
    assert f"the manifest pins {amd64.sha256}" in error
    remedy = error.split("what to do:", 1)[1]
    assert "--from BUNDLE" not in remedy and "--from" not in remedy
    assert "Make a new bundle" in remedy and "tools bundle create" in remedy
    assert list(dest.iterdir()) == []


def test_bundle_create_into_a_directory_that_does_not_exist_yet(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    """Finding 7: `--out carry/` wrote a file named `carry`."""
    name = f"sandbox-tools-{__version__}-artifacts.tar"
    made = run_tools(
        "bundle", "create", "--dist", str(fake_release.dist), "--out", "carry/", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "carry").is_dir()
    assert [p.name for p in (tmp_path / "carry").iterdir()] == [name]
    assert f"wrote carry/{name}" in made.stdout

    # A name without a trailing slash is still a file name, as with cp; a file where a
    # directory is asked for is bad input, and nothing is written.
    as_file = run_tools(
        "bundle", "create", "--dist", str(fake_release.dist), "--out", "carry.tar", cwd=tmp_path
    )
    assert as_file.returncode == 0 and (tmp_path / "carry.tar").is_file()
    clash = run_tools(
        "bundle", "create", "--dist", str(fake_release.dist), "--out", "carry.tar/", cwd=tmp_path
    )
    assert clash.returncode == 2 and "is a file, not a directory" in clash.stderr
    assert "Traceback" not in clash.stderr
    before = sorted(p.name for p in tmp_path.iterdir())
    unwritable = run_tools(
        "bundle",
        "create",
        "--dist",
        str(fake_release.dist),
        "--out",
        "/proc/no/such/",
        cwd=tmp_path,
    )
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# -- the browser add-on: optional, fetched when asked for --------------------------------


def test_fetch_takes_the_runtimes_by_default_and_the_add_on_with_browser(
    fake_release: FakeRelease, published_with_browser: Manifest, s3: S3Server, tmp_path: Path
) -> None:
    manifest = published_with_browser
    addon = manifest.for_platform("linux/amd64", ArtifactKind.BROWSER)
    dest = tmp_path / "cache"

    plain = fetch_cli(fake_release, dest)

    assert plain.returncode == 0, plain.stderr
    assert_holds_exactly(dest, manifest.only(manifest.runtimes))
    said = " ".join(plain.stdout.split())
    assert "the release also carries the browser add-on for linux/amd64" in said
    assert "--with-browser fetches it" in said

    with_browser = fetch_cli(fake_release, dest, "--with-browser", "--json")

    assert with_browser.returncode == 0, with_browser.stderr
    assert_holds_exactly(dest, manifest)
    results = {(a["kind"], a["platform"]): a for a in json.loads(with_browser.stdout)["artifacts"]}
    assert [r["result"] for k, r in results.items() if k[0] == "runtime"] == ["present"] * 2
    fetched = results[("browser", "linux/amd64")]
    assert fetched["result"] == "fetched" and fetched["sha256"] == addon.sha256
    assert fetched["source"] == addon.urls[0]  # the S3 URL the manifest lists first
    assert ("browser", "linux/arm64") not in results
    # Without --platform: every add-on the release has, and plainly which platform has none.
    said = " ".join(with_browser.stderr.split())
    assert "the release carries no browser add-on for linux/arm64" in said


def test_with_browser_where_the_release_has_none_is_bad_input(
    fake_release: FakeRelease, published_with_browser: Manifest, tmp_path: Path
) -> None:
    """A platform named that has no add-on, or a release without any: said before anything
    is fetched, with what to do instead; no traceback, no file."""
    dest = tmp_path / "cache"
    for platforms in ("arm64", "amd64,arm64"):
        result = fetch_cli(fake_release, dest, "--with-browser", "--platform", platforms)
        assert result.returncode == 2, result.stderr
        error = " ".join(result.stderr.split())
        assert (
            f"--with-browser: sandbox-tools {__version__} carries no browser add-on for "
            "linux/arm64 what to do: Fetch it where the release has one (--platform "
            "linux/amd64 --with-browser)" in error
        )
        assert "tools build --with-browser" in error and "Traceback" not in result.stderr
        assert list(dest.iterdir()) == []
    without_any = published_with_browser.only(published_with_browser.runtimes)
    with pytest.raises(ConfigurationError) as refused:
        fetch(without_any, dest, with_browser=True)
    assert refused.value.message.endswith("carries no browser add-on for linux/amd64, linux/arm64")
    assert (refused.value.remedy or "").startswith("Fetch without --with-browser (the add-on is")
    assert list(dest.iterdir()) == []


def test_an_add_on_transfer_cut_short_resumes(
    fake_release: FakeRelease,
    published_with_browser: Manifest,
    github: GitHubReleasesServer,
    tmp_path: Path,
) -> None:
    addon = published_with_browser.for_platform("linux/amd64", ArtifactKind.BROWSER)
    github.faults.truncate[addon.name] = [100_000]
    base = f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}"
    dest = tmp_path / "cache"

    outcomes = fetch(
        published_with_browser, dest, ["linux/amd64"], mirrors=[base], with_browser=True
    )

    assert [(o.artifact.kind, o.action) for o in outcomes] == [
        (ArtifactKind.RUNTIME, "fetched"),
        (ArtifactKind.BROWSER, "fetched"),
    ]
    assert sha256_of(dest / addon.name) == addon.sha256
    requests = [line.split() for line in github.faults.log if addon.name in line]
    assert len(requests) == 2 and requests[1][-1].startswith("bytes=")  # resumed, not redone
    assert 0 < int(requests[1][-1].removeprefix("bytes=").rstrip("-")) <= 100_000


def test_a_bundle_with_browser_carries_the_add_on_and_fetch_from_it_installs_it(
    fake_release: FakeRelease, published_with_browser: Manifest, tmp_path: Path
) -> None:
    manifest = published_with_browser
    addon = manifest.for_platform("linux/amd64", ArtifactKind.BROWSER)
    plain, full = tmp_path / "runtimes.tar", tmp_path / "with-browser.tar"
    made = run_tools("bundle", "create", "--dist", str(fake_release.dist), "--out", str(plain))
    assert made.returncode == 0, made.stderr
    assert "--with-browser bundles it" in " ".join(made.stdout.split())
    made = run_tools(
        "bundle", "create", "--dist", str(fake_release.dist), "--out", str(full), "--with-browser"
    )
    assert made.returncode == 0, made.stderr
    said = " ".join(made.stdout.split())
    assert "3 artifacts" in said and "the browser add-on for linux/amd64" in said
    assert "the release carries no browser add-on for linux/arm64" in said
    with tarfile.open(full) as tar:
        inside = {m.name.split("/")[-1]: m for m in tar.getmembers()}
        sums = tar.extractfile(inside["SHA256SUMS"]).read().decode()  # type: ignore[union-attr]
    assert addon.name in inside and f"{addon.sha256}  {addon.name}" in sums
    with tarfile.open(plain) as tar:
        assert addon.name not in {m.name.split("/")[-1] for m in tar.getmembers()}

    offline = tools_env(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")

    def fetch_from(bundle: Path, dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return run_tools(
            "fetch",
            "--manifest",
            str(fake_release.dist / MANIFEST_FILE),
            "--from",
            str(bundle),
            "--out",
            str(dest),
            *args,
            env=offline,
        )

    # Whatever the bundle holds is installed, verified against the trusted manifest.
    done = fetch_from(full, tmp_path / "from-full")
    assert done.returncode == 0, done.stderr
    assert_holds_exactly(tmp_path / "from-full", manifest)
    done = fetch_from(plain, tmp_path / "from-plain")
    assert done.returncode == 0, done.stderr
    assert_holds_exactly(tmp_path / "from-plain", manifest.only(manifest.runtimes))
    # Asking a bundle without it for the add-on is bad input, said before anything is copied.
    refused = fetch_from(plain, tmp_path / "refused", "--with-browser", "--platform", "amd64")
    assert refused.returncode == 2, refused.stderr
    error = " ".join(refused.stderr.split())
    assert f"the bundle {plain} holds no browser add-on for linux/amd64" in error
    assert "tools bundle create --with-browser" in error
    assert list((tmp_path / "refused").iterdir()) == []
    # A directory is no bundle carried in on purpose: the add-on comes when asked for.
    done = fetch_from(fake_release.dist, tmp_path / "from-dir")
    assert done.returncode == 0, done.stderr
    assert_holds_exactly(tmp_path / "from-dir", manifest.only(manifest.runtimes))
    done = fetch_from(fake_release.dist, tmp_path / "from-dir", "--with-browser")
    assert done.returncode == 0, done.stderr
    assert_holds_exactly(tmp_path / "from-dir", manifest)


def test_bundle_with_browser_of_a_release_without_one_is_bad_input(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    out = tmp_path / "bundle.tar"
    result = run_tools(
        "bundle", "create", "--dist", str(fake_release.dist), "--out", str(out), "--with-browser"
    )
    assert result.returncode == 2, result.stderr
    error = " ".join(result.stderr.split())
    assert f"the release of sandbox-tools {__version__} carries no browser add-on" in error
    assert "Bundle without --with-browser" in error and "Traceback" not in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".bundle.tar*"))  # no partial file
