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

from sandbox_tools import __version__
from sandbox_tools.artifacts import (
    ArtifactFormat,
    ArtifactKind,
    artifact_name,
    browser_artifact_name,
)
from sandbox_tools.errors import ConfigurationError, ReleaseRefusedError
from sandbox_tools.platforms import Arch
from sandbox_tools.publishing.publish import ReleaseRequest, publish
from sandbox_tools.publishing.targets import S3Target
from sandbox_tools.release.manifest import MANIFEST_FILE, SUMS_FILE, read_manifest
from tests.release.conftest import (
    GITHUB_REPO,
    TOKEN,
    FakeRelease,
    S3Server,
    git,
    release_args,
    run_tools,
    tools_env,
    write_validate_report,
)
from tests.release.servers import (
    DEFAULT_BRANCH_HEAD,
    FaultProxy,
    GitHubReleasesServer,
    hold_until,
    refused_url,
)

TAG = f"v{__version__}"
PREFIX = f"releases/{__version__}"


def published_files(release: FakeRelease, *addons: Arch) -> dict[str, bytes]:
    names = [artifact_name(a, ArtifactFormat.PORTABLE) for a in Arch] + [SUMS_FILE, MANIFEST_FILE]
    names += [browser_artifact_name(a) for a in addons]
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
    github.push_tag(GITHUB_REPO, TAG)
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
    # The add-on is optional: a release without one says so, and its manifest is as before.
    assert "browser add-on: none in this release" in " ".join(result.stdout.split())
    assert "addons" not in json.loads(local[MANIFEST_FILE])


def test_a_release_with_a_browser_add_on_publishes_and_pins_it(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    """The add-on built in dist/ for one platform goes out with the runtimes: uploaded,
    listed in SHA256SUMS, pinned by the manifest (beside the runtimes, not among them),
    verified as users download it; the release says plainly which platform lacks one."""
    addon = fake_release.add_browser(Arch.AMD64)
    github.push_tag(GITHUB_REPO, TAG)

    result = run_tools(*release_args(fake_release, s3, github), "--s3-public-read", "--json")

    assert result.returncode == 0, result.stderr + result.stdout
    local = published_files(fake_release, Arch.AMD64)
    assert s3_objects(s3) == local and github.uploaded(TAG) == local
    assert github.published(TAG)
    actions = [a["action"] for a in json.loads(result.stdout)["actions"]]
    assert actions.count("uploaded") == actions.count("verified") == 10  # 5 per target
    subprocess.run(["sha256sum", "-c", SUMS_FILE], cwd=fake_release.dist, check=True)
    assert f"{addon.sha256}  {addon.name}\n" in local[SUMS_FILE].decode()

    document = json.loads(local[MANIFEST_FILE])
    assert [a["name"] for a in document["addons"]] == [addon.name]
    assert all("kind" not in a for a in document["artifacts"])  # old readers: runtimes only
    manifest = read_manifest(fake_release.dist / MANIFEST_FILE)
    pinned = manifest.for_platform("linux/amd64", ArtifactKind.BROWSER)
    assert (pinned.sha256, pinned.size, pinned.build_id) == (
        addon.sha256,
        addon.size,
        addon.build_id,
    )
    assert pinned.urls == (
        f"{s3.endpoint}/{s3.bucket}/{PREFIX}/{addon.name}",
        f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}/{addon.name}",
    )
    assert manifest.find("linux/arm64", ArtifactKind.BROWSER) is None
    assert json.loads(result.stdout)["browser_addon"] == ["linux/amd64"]
    said = " ".join(result.stderr.split())  # --json: the humans' lines go to stderr
    assert "browser add-on: released for linux/amd64 only, none for linux/arm64" in said
    import requests

    for url in pinned.urls:  # anonymous, as users (and the injector) download it
        assert requests.get(url, timeout=10).content == local[addon.name]


def test_an_add_on_is_released_only_as_validated_and_named(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """Refused before anything is uploaded: an add-on the report does not name with these
    bytes, one whose bytes are not its record's, one misnamed."""
    addon = fake_release.add_browser(Arch.ARM64)
    runtimes = [r for r in fake_release.records if r.kind is ArtifactKind.RUNTIME]
    write_validate_report(fake_release.report, runtimes)  # validated before it was built
    said = refusal(fake_release, s3)
    assert f"it does not name {addon.name} with sha256 {addon.sha256}" in said

    write_validate_report(fake_release.report, fake_release.records)
    fake_release.addon(Arch.ARM64).write_bytes(b"other bytes")
    said = refusal(fake_release, s3)
    assert "do not match their build records" in said and addon.name in said

    fake_release.add_browser(Arch.ARM64)  # whole again, then misnamed in its record
    renamed = fake_release.dist / "chromium.tar.xz"
    build_json = fake_release.dist / "build.json"
    build_json.write_text(build_json.read_text().replace(addon.name, renamed.name))
    assert f"record names {renamed.name}, expected {addon.name}" in refusal(fake_release, s3)


def test_rerun_is_idempotent(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    github.push_tag(GITHUB_REPO, TAG)
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
    github.push_tag(GITHUB_REPO, TAG)
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
    github.push_tag(GITHUB_REPO, TAG)
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
        # A dry run changes nothing remotely: the leftover half-upload stays,
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
    github.push_tag(GITHUB_REPO, TAG)

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
    # Verified as users download it (anonymous HTTP, no botocore CRC): our SHA-256 sees it.
    (line,) = [line for line in result.stderr.splitlines() if f"{PREFIX}/{SUMS_FILE}:" in line]
    good = hashlib.sha256((fake_release.dist / SUMS_FILE).read_bytes()).hexdigest()
    assert "downloaded sha256" in line and f"released {good}" in line


def test_dry_run_uploads_nothing(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    (fake_release.checkout / "README").write_text("edited\n")
    github.push_tag(GITHUB_REPO, TAG)
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
    # Nothing changes locally either: no manifest or SHA256SUMS in dist/.
    assert not (fake_release.dist / MANIFEST_FILE).exists()
    assert not (fake_release.dist / SUMS_FILE).exists()


def test_quiet_keeps_the_result_and_drops_the_progress(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """The global --quiet silences progress lines, never the result table."""
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
    """Release settings in [tool.sandbox-tools]; a flag still wins over them."""
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

    fake_release.report.write_text("[]")  # once a traceback
    assert "is not a `tools validate` report" in refusal(fake_release, s3)

    fake_release.report.unlink()
    assert "no validation report" in refusal(fake_release, s3)
    fake_release.report.mkdir()
    assert "is a directory" in refusal(fake_release, s3)
    fake_release.report.rmdir()


def test_refuses_a_dirty_tree(fake_release: FakeRelease, s3: S3Server) -> None:
    (fake_release.checkout / "README").write_text("uncommitted\n")
    assert "uncommitted changes" in refusal(fake_release, s3)
    with pytest.raises(ConfigurationError, match="only for --dry-run"):
        publish(request_for(fake_release, allow_dirty=True), [S3Target(bucket=s3.bucket)])
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
    """The region was hard-coded to us-east-1 and written into the manifest's
    public URLs whatever the bucket's real region."""
    from sandbox_tools.publishing.targets import _bucket_region

    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    target = S3Target(bucket="releases", prefix="p")
    assert target.public_base_url == "https://releases.s3.eu-west-3.amazonaws.com/p"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert _bucket_region(s3.bucket, s3.endpoint) == "us-east-1"  # what the bucket says


# -- what users get, what was validated, what CI shows (the maintainer's walk) -------------


def test_s3_release_refuses_what_users_cannot_download(
    fake_release: FakeRelease, private_s3: S3Server
) -> None:
    """Finding 1: verified with the maintainer's credentials, a bucket users (anonymous)
    get 403 from was reported "uploaded, verified". Now the release checks each object as
    a user fetches it and stops after the first, naming the two remedies."""
    import requests

    args = release_args(fake_release, private_s3)
    refused = run_tools(*args)

    assert refused.returncode == 11, refused.stderr + refused.stdout
    error = " ".join(refused.stderr.split())
    assert "users cannot download it: HTTP 403" in error
    assert (
        "--s3-public-read" in error and 'give the bucket a policy allowing "s3:GetObject"' in error
    )
    assert "Traceback" not in refused.stderr
    amd64 = artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE)
    assert list(s3_objects(private_s3)) == [amd64]  # one object, and no manifest names it
    assert outcomes(refused, "verified") == 0

    # A dry run (a look before trying the remedy) refuses too: what is there is unreadable.
    dry = run_tools(*args, "--dry-run")
    assert dry.returncode == 11 and "is published, but users cannot" in dry.stderr

    # The remedy it names works: the object already there gets the ACL, the rest go up with it.
    fixed = run_tools(*args, "--s3-public-read")
    assert fixed.returncode == 0, fixed.stderr + fixed.stdout
    assert outcomes(fixed, "made public-read") == 1
    assert outcomes(fixed, "uploaded") == 3 and outcomes(fixed, "verified") == 4
    manifest = read_manifest(fake_release.dist / MANIFEST_FILE)
    for artifact in manifest.artifacts:
        (url,) = artifact.urls
        assert (
            requests.get(url, timeout=10).content
            == fake_release.artifact(artifact.arch).read_bytes()
        )


def write_matrix_report(release: FakeRelease) -> None:
    """A report as a machine without a registry writes it: debian-12 runs offline and
    passes, ubuntu-24.04 (registry only) is skipped, distroless passes what a shell-less
    image can run and skips the rest by design."""
    from sandbox_tools.validation import CellResult, CellStatus, ValidationReport

    results = []
    for r in release.records:
        for scenario in ("root", "nonroot", "readonly-exec-tmpfs"):
            results.append(CellResult(r.name, r.platform, "debian-12", scenario, CellStatus.PASSED))
            results.append(
                CellResult(
                    r.name,
                    r.platform,
                    "ubuntu-24.04",
                    scenario,
                    CellStatus.SKIPPED,
                    detail="registry unreachable, no offline recipe",
                )
            )
        results.append(CellResult(r.name, r.platform, "distroless", "root", CellStatus.PASSED))
        results.append(
            CellResult(
                r.name,
                r.platform,
                "distroless",
                "nonroot",
                CellStatus.SKIPPED,
                detail="no shell: uploads are owned by root, and nothing can hand them to "
                "another user",
            )
        )
    ValidationReport(artifacts=release.records, results=results).dump(release.report)


def test_required_distributions_refuse_skipped_rows_and_every_run_shows_coverage(
    fake_release: FakeRelease, s3: S3Server, tmp_path: Path
) -> None:
    """Finding 3: `--require` (or release-require in [tool.sandbox-tools], or the
    environment) names rows that must have passed in full; dry and real runs both print
    what was validated and what was skipped, and why."""
    write_matrix_report(fake_release)
    args = [*release_args(fake_release, s3), "--dry-run"]

    shown = run_tools(*args, "--require", "debian-12")
    assert shown.returncode == 0, shown.stderr + shown.stdout
    text = " ".join(shown.stdout.split())
    # The report's path stays whole on its line, however long (it is copied from there).
    assert f"validated by {fake_release.report} (" in shown.stdout
    assert "linux/amd64 │ passed │ debian-12, distroless" in text.replace("│ │", "│")
    assert "skipped │ ubuntu-24.04 │ registry unreachable, no offline recipe" in text
    assert "required distributions: debian-12: every cell passed" in text

    refused = run_tools(*args, "--require", "ubuntu")
    assert refused.returncode == 11, refused.stderr
    error = " ".join(refused.stderr.split())
    assert "required distributions were not validated in full" in error
    for platform in ("linux/amd64", "linux/arm64"):
        assert f"ubuntu-24.04 on {platform}: skipped nonroot, readonly-exec-tmpfs, root" in error
    # A prefix means every row it matches: rows validate never ran are gaps too.
    assert "ubuntu-20.04 on linux/arm64: not in the report (validate did not run it)" in error
    assert "tools validate --only ubuntu-20.04 --only ubuntu-22.04 --only ubuntu-24.04" in error
    assert "validated by" in refused.stdout  # the table came first, then the refusal

    as_json = run_tools(*args, "--require", "ubuntu", "--json")  # stdout: an error document
    assert as_json.returncode == 11
    document = json.loads(as_json.stdout)
    assert document["exit_code"] == 11 and "not validated in full" in document["error"]

    missing = run_tools(*args, "--require", "alpine-latest")
    assert missing.returncode == 11
    assert "alpine-latest on linux/amd64: not in the report" in missing.stderr

    # Cells a shell-less image cannot run are no gap; a typo is bad input, not a refusal.
    assert run_tools(*args, "--require", "distroless").returncode == 0
    typo = run_tools(*args, "--require", "debain-12")
    assert typo.returncode == 2 and "did you mean debian-12" in typo.stderr

    # The setting, from the project table or the environment; a flag replaces it.
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[tool.sandbox-tools]\nrelease-require = ["debian-12", "ubuntu-24.04"]\n'
    )
    from_table = run_tools(*args, cwd=project)
    assert from_table.returncode == 11 and "ubuntu-24.04 on linux/arm64" in from_table.stderr
    assert run_tools(*args, "--require", "debian-12", cwd=project).returncode == 0
    assert run_tools(*args, "--require", "", cwd=project).returncode == 0
    from_env = run_tools(*args, env=tools_env(SANDBOX_TOOLS_RELEASE_REQUIRE="debian-12,ubuntu"))
    assert from_env.returncode == 11 and "ubuntu-24.04 on linux/amd64" in from_env.stderr
    assert s3_objects(s3) == {}

    # The real run shows the same before it publishes, and --json carries it.
    real = run_tools(*release_args(fake_release, s3), "--require", "debian-12", "--json")
    assert real.returncode == 0, real.stderr
    validated = json.loads(real.stdout)["validated"]
    assert validated["required"] == ["debian-12"] and validated["gaps"] == []
    states = {(r["platform"], r["distro"]): r["state"] for r in validated["rows"]}
    assert states[("linux/arm64", "ubuntu-24.04")] == "skipped"
    assert states[("linux/arm64", "distroless")] == "passed"
    assert "validated by" in real.stderr  # --json: the table moved to stderr


def test_release_writes_a_github_step_summary_and_annotations(
    fake_release: FakeRelease, s3: S3Server, tmp_path: Path
) -> None:
    """Finding 4: build and validate wrote a step summary on GitHub Actions, release none."""
    summary = tmp_path / "summary.md"
    env = tools_env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    write_matrix_report(fake_release)

    done = run_tools(*release_args(fake_release, s3), "--require", "debian-12", env=env)
    assert done.returncode == 0, done.stderr
    page = summary.read_text()
    version = __import__("sandbox_tools").__version__
    assert page.startswith(f"## tools release {version}: published and verified")
    assert "| linux/amd64 | skipped | ubuntu-24.04 | registry unreachable" in page
    assert "required distributions: debian-12: every cell passed" in page
    amd64 = artifact_name(Arch.AMD64, ArtifactFormat.PORTABLE)
    assert f"| s3://{s3.bucket}/{PREFIX} | {amd64} | uploaded, verified |" in page
    assert f"{s3.endpoint}/{s3.bucket}/{PREFIX}/{amd64}" in page  # the manifest's URL

    refused = run_tools(*release_args(fake_release, s3), "--require", "ubuntu", env=env)
    assert refused.returncode == 11
    assert "::error title=tools release::" in refused.stdout
    later = summary.read_text()[len(page) :]
    assert later.startswith(f"## tools release {version}: refused")
    assert "required distributions were not validated in full" in later
    assert "What to do:" in later


# -- the GitHub tag, and every refusal before anything is created ---------------------------


def test_the_github_stand_in_creates_a_missing_tag_as_github_does() -> None:
    """What `tools release` must never trigger, modelled as GitHub behaves: a release made
    public (created public, or a draft published) whose tag does not exist gets that tag
    at the default branch's head. A tag is a ref: GET git/ref/tags/TAG is 200 or 404."""
    import requests

    server = GitHubReleasesServer(token=TOKEN)
    try:
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {TOKEN}"
        repo = f"{server.url}/repos/{GITHUB_REPO}"
        assert api.get(f"{repo}/git/ref/tags/v9", timeout=10).status_code == 404
        draft = api.post(f"{repo}/releases", json={"tag_name": "v9", "draft": True}, timeout=10)
        assert api.get(f"{repo}/git/ref/tags/v9", timeout=10).status_code == 404  # no tag
        api.patch(f"{repo}/releases/{draft.json()['id']}", json={"draft": False}, timeout=10)
        ref = api.get(f"{repo}/git/ref/tags/v9", timeout=10)
        assert ref.status_code == 200
        assert ref.json()["ref"] == "refs/tags/v9"
        assert ref.json()["object"]["sha"] == DEFAULT_BRANCH_HEAD
        api.post(f"{repo}/releases", json={"tag_name": "v10", "draft": False}, timeout=10)
        assert server.tags_made_by_releases == [(GITHUB_REPO, "v9"), (GITHUB_REPO, "v10")]

        server.push_tag(GITHUB_REPO, "v11", "a" * 40)  # pushed first: GitHub keeps it
        api.post(f"{repo}/releases", json={"tag_name": "v11", "draft": False}, timeout=10)
        assert api.get(f"{repo}/git/ref/tags/v11", timeout=10).json()["object"]["sha"] == "a" * 40
        assert len(server.tags_made_by_releases) == 2
    finally:
        server.stop()


def test_release_refuses_to_publish_on_a_tag_that_does_not_exist(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    """Publishing a GitHub release whose tag is missing makes GitHub create the tag at the
    default branch's head. RELEASING.md's command refuses first, before anything is
    uploaded anywhere; a draft needs no tag; publishing the draft checks again. (The
    `github` fixture checks, after every test, that no release made GitHub create a tag.)"""
    args = [*release_args(fake_release, s3, github), "--version", __version__]
    for extra in ([], ["--dry-run"]):
        refused = run_tools(*args, *extra)
        assert refused.returncode == 11, refused.stderr + refused.stdout
        error = " ".join(refused.stderr.split())
        assert f"the tag {TAG} does not exist in {GITHUB_REPO}" in error
        assert f"Push the tag first (git push origin {TAG}" in error
        assert "or pass --github-draft" in error
        assert "Traceback" not in refused.stderr
    assert github.releases == {} and s3_objects(s3) == {}  # refused before anything

    draft = run_tools(*args, "--github-draft")  # a draft may be made without the tag
    assert draft.returncode == 0, draft.stderr + draft.stdout
    assert not github.published(TAG) and len(github.uploaded(TAG)) == 4
    assert (
        f"the GitHub release is a draft: once the tag {TAG} exists, run the same command "
        "without --github-draft to publish it" in " ".join(draft.stdout.split())
    )

    # Publishing the draft checks the tag too: still missing, so refused, still a draft.
    again = run_tools(*args)
    assert again.returncode == 11 and "does not exist" in again.stderr
    assert not github.published(TAG)
    assert not any(line.startswith("PATCH") for line in github.faults.log)

    github.push_tag(GITHUB_REPO, TAG, "e" * 40)  # step 5: the tag on the manifest's commit
    published = run_tools(*args)
    assert published.returncode == 0, published.stderr + published.stdout
    assert github.published(TAG) and github.tags[(GITHUB_REPO, TAG)] == "e" * 40
    assert outcomes(published, "skipped (identical)") == 8
    assert outcomes(published, "verified") == 8


def test_github_draft_on_a_published_release_says_it_stays_published(
    fake_release: FakeRelease, github: GitHubReleasesServer
) -> None:
    """--github-draft cannot make a published release a draft again, and says so (it used
    to say "still a draft")."""
    github.push_tag(GITHUB_REPO, TAG)
    args = release_args(fake_release, github=github)
    assert run_tools(*args).returncode == 0 and github.published(TAG)

    again = run_tools(*args, "--github-draft")

    assert again.returncode == 0, again.stderr + again.stdout
    said = " ".join(again.stdout.split())
    assert (
        f"github:{GITHUB_REPO}@{TAG}: the GitHub release was already published; "
        "--github-draft does not make it a draft again" in said
    )
    assert "is a draft" not in said and "still a draft" not in said
    assert github.published(TAG)


def test_a_refusal_from_s3_comes_before_any_github_draft(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> None:
    """Every refusal comes before anything is created: an S3 object with other bytes was
    refused only after an empty GitHub draft had been created."""
    assert run_tools(*release_args(fake_release, s3)).returncode == 0  # S3 alone, earlier
    fake_release.rebuild(Arch.ARM64, b"rebuilt with other bytes" * 1000)

    refused = run_tools(*release_args(fake_release, s3, github), "--github-draft")

    assert refused.returncode == 11, refused.stderr + refused.stdout
    assert "published objects have different bytes" in refused.stderr
    assert github.releases == {} and github.faults.uploads == 0
    assert not [line for line in github.faults.log if not line.startswith("GET")]


def test_the_require_remedy_names_the_registry_only_for_rows_that_need_it(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """A required row with an offline recipe (matrix.toml's `offline`) is validated
    anywhere; the remedy sent every row to "a machine that reaches the registry"."""
    write_matrix_report(fake_release)  # debian-12 and distroless ran; no debian-13 at all
    args = [*release_args(fake_release, s3), "--dry-run"]

    offline = run_tools(*args, "--require", "debian-13")

    assert offline.returncode == 11, offline.stderr + offline.stdout
    remedy = " ".join(offline.stderr.split()).split("what to do:", 1)[1]
    assert "`tools validate --only debian-13` (their images are also built offline" in remedy
    assert "registry" not in remedy

    both = run_tools(*args, "--require", "ubuntu-24.04,debian-13")

    assert both.returncode == 11, both.stderr + both.stdout
    remedy = " ".join(both.stderr.split()).split("what to do:", 1)[1]
    assert "`tools validate --only ubuntu-24.04` on a machine that reaches the registry" in remedy
    assert "`tools validate --only debian-13` (their images are also built offline" in remedy


def test_allow_dirty_without_dry_run_is_bad_input_said_first(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """`tools release --allow-dirty` without --dry-run printed the validation table, then
    exited 11: it is bad input, refused in one line before anything is read."""
    (fake_release.checkout / "README").write_text("uncommitted\n")

    result = run_tools(*release_args(fake_release, s3), "--allow-dirty")

    assert result.returncode == 2, result.stderr + result.stdout
    assert result.stderr.splitlines()[0] == "error: --allow-dirty is only for --dry-run"
    assert "validated by" not in result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert s3_objects(s3) == {}
    assert run_tools(*release_args(fake_release, s3), "--allow-dirty", "--dry-run").returncode == 0


def test_commit_the_manifest_is_said_only_while_there_is_something_to_commit(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """An all-identical rerun after the manifest was committed still said "wrote
    .../published/manifest.json: commit it"."""
    package = fake_release.checkout / "src" / "sandbox_tools" / "release"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    git(fake_release.checkout, "add", "src")
    git(fake_release.checkout, "commit", "-qm", "the package")
    args = release_args(fake_release, s3)

    first = run_tools(*args)
    assert first.returncode == 0, first.stderr + first.stdout
    said = "".join(first.stdout.split())
    assert f"wrote{package}/published/{MANIFEST_FILE}:commitit" in said, first.stdout

    rerun = run_tools(*args)  # identical, and not committed yet: still to commit
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    said = "".join(rerun.stdout.split())
    assert f"kept(notcommittedyet){package}/published/{MANIFEST_FILE}:commitit" in said

    git(fake_release.checkout, "add", "src")
    git(fake_release.checkout, "commit", "-qm", "Manifest")
    committed = run_tools(*args)
    assert committed.returncode == 0, committed.stderr + committed.stdout
    assert outcomes(committed, "skipped (identical)") == 4
    assert "commit it" not in committed.stdout and "wrote" not in committed.stdout


def test_a_dry_run_that_cannot_reach_github_says_what_to_do_without_uploads(
    fake_release: FakeRelease,
) -> None:
    """Its remedy said "... objects already published are compared and skipped, the rest
    are uploaded": a dry run uploads nothing."""
    github = ["--github-repo", GITHUB_REPO, "--github-api-url", refused_url(), "--github-draft"]
    args = [*release_args(fake_release), *github]

    dry = run_tools(*args, "--dry-run")

    assert dry.returncode == 14, dry.stderr + dry.stdout
    error, remedy = " ".join(dry.stderr.split()).split("what to do:", 1)
    assert "cannot compare with what is published" in error
    assert "upload" not in remedy and "run the same dry run again" in remedy
    real = run_tools(*args)  # the real run's remedy is about resuming the uploads
    assert real.returncode == 14
    assert "the rest are uploaded" in " ".join(real.stderr.split())


def test_require_says_which_cells_were_skipped_by_design(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """`--require no-shell` said "every cell passed" while 3 of its 4 cells were skipped
    (by design: they need a shell the image lacks, so they are no gap)."""
    from sandbox_tools.distro_matrix.matrix import load_matrix, shell_less_skip
    from sandbox_tools.validation import CellResult, CellStatus, ValidationReport

    matrix = load_matrix()
    (no_shell,) = [d for d in matrix.distros if d.name == "no-shell"]
    results = []
    for record in fake_release.records:  # the runtimes: their tool scenarios
        for scenario in (s for s in matrix.scenarios if not s.browser):
            why = shell_less_skip(no_shell, scenario)
            status = CellStatus.PASSED if why is None else CellStatus.SKIPPED
            results.append(
                CellResult(
                    record.name,
                    record.platform,
                    "no-shell",
                    scenario.name,
                    status,
                    detail=why or "",
                )
            )
    skipped = sum(r.status is CellStatus.SKIPPED for r in results)
    assert skipped == 6 and len(results) == 8
    ValidationReport(artifacts=fake_release.records, results=results).dump(fake_release.report)

    result = run_tools(*release_args(fake_release, s3), "--dry-run", "--require", "no-shell")

    assert result.returncode == 0, result.stderr + result.stdout
    text = " ".join(result.stdout.split())
    assert (
        "required distributions: no-shell: every cell that can run there passed; "
        f"{skipped} skipped by design" in text
    ), text
    assert "every cell passed" not in text


def test_the_github_stand_in_runs_on_its_own_and_takes_a_pushed_tag(tmp_path: Path) -> None:
    """scripts/release_rehearsal.sh starts it as a process and pushes the tag over HTTP."""
    import requests

    server = subprocess.Popen(
        [sys.executable, "-m", "tests.release.servers", "github", "--token", TOKEN],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        refs = f"{url}/repos/{GITHUB_REPO}/git/refs"
        ref = {"ref": f"refs/tags/{TAG}", "sha": "f" * 40}
        assert requests.post(refs, json=ref, timeout=10).status_code == 401  # no token
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert requests.post(refs, json=ref, headers=auth, timeout=10).status_code == 201
        assert requests.post(refs, json=ref, headers=auth, timeout=10).status_code == 422
        got = requests.get(f"{refs[:-1]}/tags/{TAG}", headers=auth, timeout=10)
        assert got.json()["object"]["sha"] == "f" * 40
    finally:
        server.terminate()
    assert server.wait(timeout=10) == 0


def test_an_add_on_is_released_only_on_its_browser_cells(
    fake_release: FakeRelease, s3: S3Server
) -> None:
    """An add-on's static checks alone let a release ship browser bytes no cell ran: its
    browser cells are required as a runtime's cells are, and a required distribution
    must have them too."""
    from sandbox_tools.validation import CellResult, CellStatus, ValidationReport

    addon = fake_release.add_browser(Arch.AMD64)
    report = ValidationReport.load(fake_release.report)
    cell = next(r for r in report.results if r.artifact == addon.name)
    assert cell.scenario == "browser-root"  # what write_validate_report gives an add-on

    cell.status, cell.detail = CellStatus.FAILED, "the form's submission: net::ERR_FAILED"
    report.dump(fake_release.report)
    failed = run_tools(*release_args(fake_release, s3), "--dry-run")
    assert failed.returncode == 11, failed.stderr + failed.stdout
    said = " ".join(failed.stderr.split())
    assert f"validation failed for {addon.name}: debian-12/amd64/browser-root" in said, said

    report.results = [r for r in report.results if r.artifact != addon.name]
    report.dump(fake_release.report)
    none = run_tools(*release_args(fake_release, s3), "--dry-run")
    assert none.returncode == 11
    assert f"no validation cell passed for {addon.name}" in " ".join(none.stderr.split())

    # Passed on debian-12 only: requiring busybox finds the add-on's gap beside the
    # runtimes' (each runtime passed busybox; the add-on has no busybox row).
    report.results.append(
        CellResult(addon.name, addon.platform, "debian-12", "browser-root", CellStatus.PASSED)
    )
    for record in fake_release.records:
        if record.kind is ArtifactKind.RUNTIME:
            for scenario in ("root", "nonroot", "readonly-exec-tmpfs", "readonly-noexec"):
                report.results.append(
                    CellResult(record.name, record.platform, "busybox", scenario, CellStatus.PASSED)
                )
    report.dump(fake_release.report)
    gap = run_tools(*release_args(fake_release, s3), "--dry-run", "--require", "busybox")
    assert gap.returncode == 11, gap.stderr + gap.stdout
    said = " ".join(gap.stderr.split())
    assert (
        "busybox on linux/amd64 browser add-on: not in the report (validate did not run it)" in said
    ), said
    assert "busybox on linux/arm64:" not in said and "busybox on linux/amd64:" not in said
