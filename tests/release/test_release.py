"""`tools release` against real servers: moto's S3 (real boto3) and a local GitHub API."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.artifacts import ArtifactFormat, artifact_name
from sandbox_tools.errors import ReleaseRefusedError
from sandbox_tools.platforms import Arch
from sandbox_tools.release.manifest import MANIFEST_FILE, SUMS_FILE, read_manifest
from sandbox_tools.release.publish import ReleaseRequest, publish
from sandbox_tools.release.targets import S3Target
from tests.release.conftest import (
    GITHUB_REPO,
    FakeRelease,
    S3Server,
    git,
    release_args,
    run_tools,
    tools_env,
    write_validate_report,
)
from tests.release.servers import FaultProxy, GitHubReleasesServer, hold_until

TAG = "v" + __import__("sandbox_tools").__version__
PREFIX = "releases/" + __import__("sandbox_tools").__version__


def published_files(release: FakeRelease) -> dict[str, bytes]:
    names = [artifact_name(a, ArtifactFormat.PORTABLE) for a in Arch] + [SUMS_FILE, MANIFEST_FILE]
    return {name: (release.dist / name).read_bytes() for name in names}


def outcomes(result: subprocess.CompletedProcess[str], action: str) -> int:
    """How many `<target>/<file>: <action>` lines the release printed (not the table)."""
    return sum(line.endswith(f": {action}") for line in result.stdout.splitlines())


def s3_objects(s3: S3Server) -> dict[str, bytes]:
    client: Any = s3.client()
    listing = client.list_objects_v2(Bucket=s3.bucket).get("Contents", [])
    return {
        o["Key"].removeprefix(PREFIX + "/"): client.get_object(Bucket=s3.bucket, Key=o["Key"])[
            "Body"
        ].read()
        for o in listing
    }


def test_round_trip_to_s3_and_github(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    # Public-read is asked for explicitly: it is off by default (new buckets disable ACLs).
    result = run_tools(*release_args(fake_release, s3, github), "--s3-public-read")
    assert result.returncode == 0, result.stderr + result.stdout

    local = published_files(fake_release)
    assert s3_objects(s3) == local
    assert github.uploaded(TAG) == local
    assert github.published(TAG)  # created as a draft, published after verification
    assert any(line.startswith("PATCH") for line in github.faults.log)
    assert outcomes(result, "uploaded") == 8 and outcomes(result, "verified") == 8
    # sha256sum itself accepts the SHA256SUMS written next to the artifacts.
    subprocess.run(["sha256sum", "-c", SUMS_FILE], cwd=fake_release.dist, check=True)

    manifest = read_manifest(fake_release.dist / MANIFEST_FILE)
    amd64 = manifest.for_platform("linux/amd64")
    assert amd64.urls == (
        f"{s3.endpoint}/{s3.bucket}/{PREFIX}/{amd64.name}",
        f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}/{amd64.name}",
    )
    # The public URLs the manifest lists serve the released bytes (anonymous, no token).
    import requests

    for url in amd64.urls:
        assert requests.get(url, timeout=10).content == local[amd64.name]


def test_rerun_is_idempotent(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    assert run_tools(*release_args(fake_release, s3, github)).returncode == 0
    uploads = github.faults.uploads

    again = run_tools(*release_args(fake_release, s3, github))
    assert again.returncode == 0, again.stderr
    assert outcomes(again, "skipped (identical)") == 8
    assert outcomes(again, "uploaded") == 0
    assert github.faults.uploads == uploads
    assert s3_objects(s3) == published_files(fake_release)


def test_different_bytes_are_refused_before_any_upload(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    assert run_tools(*release_args(fake_release, s3, github)).returncode == 0
    published = s3_objects(s3)
    uploads = github.faults.uploads

    fake_release.rebuild(Arch.ARM64, b"rebuilt with other bytes" * 1000)
    refused = run_tools(*release_args(fake_release, s3, github))

    assert refused.returncode == 11
    assert "published objects have different bytes" in refused.stderr
    assert "Bump the version" in refused.stderr
    arm64 = artifact_name(Arch.ARM64, ArtifactFormat.PORTABLE)
    assert f"s3://{s3.bucket}/{PREFIX}/{arm64}" in refused.stderr
    assert f"github:{GITHUB_REPO}@{TAG}/{arm64}" in refused.stderr
    assert s3_objects(s3) == published
    assert github.faults.uploads == uploads
    assert "--force" not in run_tools("release", "--help").stdout


@pytest.mark.parametrize("where", ["s3", "github"])
def test_crash_after_second_upload_then_rerun_completes(
    where: str,
    fake_release: FakeRelease,
    s3: S3Server,
    s3_proxy: FaultProxy,
    github: GitHubReleasesServer,
) -> None:
    faults = s3_proxy.faults if where == "s3" else github.faults
    faults.hold_after = 2
    args = (
        release_args(fake_release, s3, s3_endpoint=s3_proxy.url)
        if where == "s3"
        else release_args(fake_release, github=github)
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "sandbox_tools.cli", *args],
        env=tools_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        hold_until(faults.held, timeout=120)  # the third upload is in flight
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    if where == "s3":
        assert len(s3_objects(s3)) == 2
    else:
        assert len(github.uploaded(TAG)) == 2
        assert [a.state for a in github.assets.values()].count("starter") == 1
    faults.hold_after = None
    faults.release_hold.set()
    if where == "github":
        # A dry run changes nothing remotely: the leftover half-upload stays (issue 18),
        # and the interrupted release is still a draft nobody can download from.
        dry = run_tools(*args, "--dry-run")
        assert dry.returncode == 0, dry.stderr + dry.stdout
        assert [a.state for a in github.assets.values()].count("starter") == 1
        assert not github.published(TAG)

    rerun = run_tools(*args)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    assert outcomes(rerun, "skipped (identical)") == 2
    assert outcomes(rerun, "uploaded") == 2
    assert outcomes(rerun, "verified") == 4
    published = s3_objects(s3) if where == "s3" else github.uploaded(TAG)
    assert published == published_files(fake_release)


def test_round_trip_catches_an_object_corrupted_on_the_server(
    fake_release: FakeRelease, github: GitHubReleasesServer
) -> None:
    amd64 = artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE)
    github.faults.corrupt.add(amd64)

    result = run_tools(*release_args(fake_release, github=github))

    assert result.returncode == 12
    assert "do not round-trip" in result.stderr
    good = hashlib.sha256(fake_release.artifact(Arch.AMD64).read_bytes()).hexdigest()
    assert f"released {good}" in result.stderr
    assert result.stderr.count("downloaded sha256") == 1


def test_s3_round_trip_catches_corruption_through_the_wire(
    fake_release: FakeRelease, s3: S3Server, s3_proxy: FaultProxy
) -> None:
    s3_proxy.faults.corrupt.add(SUMS_FILE)
    result = run_tools(*release_args(fake_release, s3, s3_endpoint=s3_proxy.url))
    assert result.returncode == 12, result.stderr
    # botocore checks the CRC S3 sent before our SHA-256 does; either way it is caught.
    (line,) = [line for line in result.stderr.splitlines() if f"{PREFIX}/{SUMS_FILE}:" in line]
    assert "did not match" in line and "while downloading it again" in line


def test_dry_run_uploads_nothing(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    (fake_release.checkout / "README").write_text("edited\n")
    result = run_tools(
        *release_args(fake_release, s3, github), "--dry-run", "--allow-dirty", "--json"
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # stdout: the JSON only
    assert document["dry_run"] is True
    assert [a["action"] for a in document["actions"]] == ["would upload"] * 8
    urls = [u for a in document["manifest"]["artifacts"] for u in a["urls"]]
    assert len(urls) == 4 and all(u.startswith((s3.endpoint, github.url)) for u in urls)
    assert s3_objects(s3) == {}
    assert github.releases == {} and github.faults.uploads == 0
    # Nothing changes locally either (issue 18): no manifest or SHA256SUMS in dist/.
    assert not (fake_release.dist / MANIFEST_FILE).exists()
    assert not (fake_release.dist / SUMS_FILE).exists()


def test_quiet_keeps_the_result_and_drops_the_progress(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """Issue 18: the global --quiet silences progress lines, never the result table."""
    args = (*release_args(fake_release, s3), "--dry-run")
    loud, hushed = run_tools(*args), run_tools("--quiet", *args)
    assert loud.returncode == hushed.returncode == 0, loud.stderr + hushed.stderr
    assert outcomes(loud, "would upload") == 4
    assert outcomes(hushed, "would upload") == 0
    assert hushed.stdout.count("would upload") == 4  # the table's rows
    assert not hushed.stderr


def test_where_to_publish_can_come_from_the_project_settings(
    fake_release: FakeRelease, s3: S3Server, tmp_path: Path
) -> None:
    """Issue 17: release settings in [tool.sandbox-tools]; a flag still wins over them."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[tool.sandbox-tools]\n"
        f's3-bucket = "{s3.bucket}"\n'
        f's3-endpoint-url = "{s3.endpoint}"\n'
        's3-prefix = "from-settings/{version}"\n'
    )
    args = [*release_args(fake_release), "--dry-run", "--json"]
    from_table = run_tools(*args, cwd=project)
    assert from_table.returncode == 0, from_table.stderr
    urls = [u for a in json.loads(from_table.stdout)["manifest"]["artifacts"] for u in a["urls"]]
    assert urls and all("/from-settings/" in u for u in urls), urls

    flagged = run_tools(*args, "--s3-prefix", "from-flag/{version}", cwd=project)
    assert flagged.returncode == 0, flagged.stderr
    urls = [u for a in json.loads(flagged.stdout)["manifest"]["artifacts"] for u in a["urls"]]
    assert urls and all("/from-flag/" in u for u in urls), urls


# -- preconditions (in process: nothing reaches a server before they hold) ------------------


def request_for(release: FakeRelease, **overrides: Any) -> ReleaseRequest:
    fields: dict[str, Any] = {
        "dist": release.dist,
        "validate_report": release.report,
        "checkout": release.checkout,
    }
    return ReleaseRequest(**{**fields, **overrides})


def refusal(release: FakeRelease, s3: S3Server, **overrides: Any) -> str:
    target = S3Target(bucket=s3.bucket, prefix=PREFIX, endpoint_url=s3.endpoint)
    with pytest.raises(ReleaseRefusedError) as caught:
        publish(request_for(release, **overrides), [target])
    assert s3_objects(s3) == {}
    return caught.value.message


def test_refuses_another_version(fake_release: FakeRelease, s3: S3Server) -> None:
    assert "asked to release 9.9.9" in refusal(fake_release, s3, expected_version="9.9.9")
    build_json = fake_release.dist / "build.json"
    document = json.loads(build_json.read_text())
    build_json.write_text(json.dumps({**document, "version": "0.0.1"}))
    assert "built for version 0.0.1" in refusal(fake_release, s3)


def test_refuses_artifacts_that_do_not_match_their_records(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    path = fake_release.artifact(Arch.AMD64)
    path.write_bytes(b"x" + path.read_bytes()[1:])
    assert "do not match their build records" in refusal(fake_release, s3)
    path.unlink()
    assert "missing" in refusal(fake_release, s3)


def test_refuses_a_missing_platform(fake_release: FakeRelease, s3: S3Server) -> None:
    from sandbox_tools.artifacts import BUILD_RECORD_FILE

    build_json = fake_release.dist / BUILD_RECORD_FILE
    document = json.loads(build_json.read_text())
    document["artifacts"] = [a for a in document["artifacts"] if a["platform"] != "linux/arm64"]
    build_json.write_text(json.dumps(document))
    assert "no portable artifact for linux/arm64" in refusal(fake_release, s3)


def test_refuses_bytes_that_were_not_validated(fake_release: FakeRelease, s3: S3Server) -> None:
    other = [
        r if r.platform != "linux/amd64" else replace(r, sha256="0" * 64)
        for r in fake_release.records
    ]
    write_validate_report(fake_release.report, other)
    assert "these bytes were not validated" in refusal(fake_release, s3)

    report = json.loads(fake_release.report.read_text())
    write_validate_report(fake_release.report, fake_release.records)
    report = json.loads(fake_release.report.read_text())
    report["results"][0]["status"] = "failed"
    fake_release.report.write_text(json.dumps(report))
    assert "validation failed for" in refusal(fake_release, s3)

    fake_release.report.write_text("[]")  # once a traceback (issue 18)
    assert "is not a `tools validate` report" in refusal(fake_release, s3)

    fake_release.report.unlink()
    assert "no validation report" in refusal(fake_release, s3)
    fake_release.report.mkdir()
    assert "is a directory" in refusal(fake_release, s3)
    fake_release.report.rmdir()


def test_refuses_a_dirty_tree(fake_release: FakeRelease, s3: S3Server) -> None:
    (fake_release.checkout / "README").write_text("uncommitted\n")
    assert "uncommitted changes" in refusal(fake_release, s3)
    assert "only for --dry-run" in refusal(fake_release, s3, allow_dirty=True)
    git(fake_release.checkout, "commit", "-qam", "now committed")
    publish(
        request_for(fake_release, dry_run=True),
        [S3Target(bucket=s3.bucket, prefix=PREFIX, endpoint_url=s3.endpoint)],
    )


def test_refuses_outside_a_checkout(
    fake_release: FakeRelease, s3: S3Server, tmp_path: Path
) -> None:
    assert "not in a git checkout" in refusal(fake_release, s3, checkout=None)


def test_the_s3_region_comes_from_the_environment_or_the_bucket(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18: the region was hard-coded to us-east-1 and written into the manifest's
    public URLs whatever the bucket's real region."""
    from sandbox_tools.release.targets import _bucket_region

    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    target = S3Target(bucket="releases", prefix="p")
    assert target.public_base_url == "https://releases.s3.eu-west-3.amazonaws.com/p"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert _bucket_region(s3.bucket, s3.endpoint) == "us-east-1"  # what the bucket says
