"""`tools fetch` and bundles: real HTTP from moto's S3 and the GitHub server, real files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_tools import __version__
from sandbox_tools.artifacts import sha256_of
from sandbox_tools.errors import FetchError
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
    """Every artifact verified, and nothing else but the digest cache (no partial files)."""
    for artifact in manifest.artifacts:
        assert sha256_of(dest / artifact.name) == artifact.sha256
        assert os.access(dest / artifact.name, os.X_OK)
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
