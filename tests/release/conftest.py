"""Release fixtures: a fake release in dist/ (any bytes work), moto's S3 server, the local
GitHub releases server, and a helper to run the real `tools` CLI in a subprocess.

The real browser add-on is about 100 MB; `FakeRelease.add_browser` makes a small real
tar.xz with a record of kind browser instead: the release, fetch, bundle and injector
treat it by its name, size and SHA-256 alone, as they treat the real one."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools import __version__
from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    artifact_name,
    browser_artifact_name,
    write_build_records,
)
from sandbox_tools.injector.acquire import current_build_id
from sandbox_tools.platforms import Arch
from sandbox_tools.publishing.publish import ReleaseRequest, publish
from sandbox_tools.publishing.targets import GitHubTarget, S3Target
from sandbox_tools.release.manifest import MANIFEST_FILE, Manifest, read_manifest
from sandbox_tools.runtime.addons import digest_of_archive
from sandbox_tools.validation import CellResult, CellStatus, ValidationReport
from tests.release.servers import FaultProxy, GitHubReleasesServer

GITHUB_REPO = "acme/sandbox-tools"
TOKEN = "test-token"


@dataclass
class FakeRelease:
    root: Path
    dist: Path
    report: Path
    checkout: Path
    records: list[Artifact]

    def artifact(self, arch: Arch) -> Path:
        return self.dist / artifact_name(arch, ArtifactFormat.PORTABLE)

    def addon(self, arch: Arch) -> Path:
        return self.dist / browser_artifact_name(arch)

    def add_browser(self, arch: Arch) -> Artifact:
        """A browser add-on for `arch` in dist/, recorded and validated like a real one
        (`tools build --with-browser`, then `tools validate`)."""
        data = small_addon(arch)
        self.addon(arch).write_bytes(data)
        record = _browser_record(arch, data)
        self.records = [
            *(r for r in self.records if (r.kind, r.arch) != (ArtifactKind.BROWSER, arch)),
            record,
        ]
        write_build_records(self.dist, self.records)
        write_validate_report(self.report, self.records)
        return record

    def rebuild(self, arch: Arch, data: bytes) -> None:
        """Different bytes under the same version, recorded and validated like real ones."""
        path = self.artifact(arch)
        path.write_bytes(data)
        self.records = [
            _record(arch, data) if (r.kind, r.arch) == (ArtifactKind.RUNTIME, arch) else r
            for r in self.records
        ]
        write_build_records(self.dist, self.records)
        write_validate_report(self.report, self.records)


def _record(arch: Arch, data: bytes) -> Artifact:
    return Artifact(
        name=artifact_name(arch, ArtifactFormat.PORTABLE),
        arch=arch,
        format=ArtifactFormat.PORTABLE,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        # What the current sources would build: the injector accepts a released artifact
        # from the cache only while the sources are the released ones.
        build_id=current_build_id(arch, ArtifactFormat.PORTABLE),
    )


def small_addon(arch: Arch) -> bytes:
    """A real tar.xz shaped like the add-on (a launcher, its metadata), of a few hundred
    kB that xz cannot shrink: big enough for a transfer to be cut and resumed."""
    members = {
        "chrome": b"#!/bin/sh\necho small stand-in for the browser\n",
        "browser.json": json.dumps({"kind": "browser", "arch": arch.value}).encode(),
        "lib/payload.bin": os.urandom(250_000),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o755
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def _browser_record(arch: Arch, data: bytes) -> Artifact:
    return Artifact(
        name=browser_artifact_name(arch),
        arch=arch,
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        # What the current sources would build: the injector's test of a released add-on.
        build_id=current_build_id(arch, ArtifactFormat.TAR_XZ, ArtifactKind.BROWSER),
        tree=digest_of_archive(io.BytesIO(data)),  # as tools build records it
    )


def write_validate_report(path: Path, records: list[Artifact]) -> None:
    """A report as `tools validate` writes it: the exact artifacts, one passed cell for
    each runtime and one passed browser cell for each add-on, sound static checks."""
    ValidationReport(
        artifacts=records,
        results=[
            CellResult(
                r.name,
                r.platform,
                "debian-12",
                "root" if r.kind is ArtifactKind.RUNTIME else "browser-root",
                CellStatus.PASSED,
            )
            for r in records
        ],
        static={r.name: [] for r in records if r.kind is not ArtifactKind.RUNTIME},
    ).dump(path)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def fake_release(tmp_path: Path) -> FakeRelease:
    dist = tmp_path / "dist"
    dist.mkdir()
    records = []
    for arch in Arch:
        data = os.urandom(300_000) + arch.value.encode()
        (dist / artifact_name(arch, ArtifactFormat.PORTABLE)).write_bytes(data)
        records.append(_record(arch, data))
    write_build_records(dist, records)
    report = tmp_path / "validate-report.json"
    write_validate_report(report, records)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    git(checkout, "init", "-q")
    (checkout / "README").write_text("released from here\n")
    git(checkout, "add", "README")
    git(checkout, "commit", "-qm", "release")
    return FakeRelease(tmp_path, dist, report, checkout, records)


@dataclass
class S3Server:
    endpoint: str
    bucket: str

    def client(self) -> object:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


@pytest.fixture(scope="session")
def _moto() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def public_read_policy(bucket: str) -> str:
    """What RELEASING.md asks of a release bucket: anyone may read its objects."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{bucket}/*",
                }
            ],
        }
    )


def _bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, public: bool) -> S3Server:
    for key, value in aws_env().items():
        monkeypatch.setenv(key, value)
    import boto3

    bucket = f"releases-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    if public:
        client.put_bucket_policy(Bucket=bucket, Policy=public_read_policy(bucket))
    return S3Server(endpoint, bucket)


@pytest.fixture
def s3(_moto: str, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """A fresh bucket on the real moto server (boto3 in this process and in children),
    readable by anyone through a bucket policy, as a release bucket must be."""
    return _bucket(_moto, monkeypatch, public=True)


@pytest.fixture
def private_s3(_moto: str, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """A fresh bucket only its owner can read: moto answers anonymous GETs with 403."""
    return _bucket(_moto, monkeypatch, public=False)


def aws_env() -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }


@pytest.fixture
def github() -> Iterator[GitHubReleasesServer]:
    """The GitHub stand-in. Whatever a test does, `tools release` must never have made
    GitHub create a tag (a release made public while its tag was missing)."""
    server = GitHubReleasesServer(token=TOKEN)
    yield server
    server.stop()
    assert server.tags_made_by_releases == [], "a release was made public without its tag"


@pytest.fixture
def s3_proxy(s3: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3.endpoint)
    yield proxy
    proxy.stop()


def tools_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **aws_env(), "GITHUB_TOKEN": TOKEN, **extra}
    env.pop("SANDBOX_TOOLS_CACHE", None)
    return env


def run_tools(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process: exit codes, output and crashes are the user's."""
    return subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", *args],
        capture_output=True,
        text=True,
        env=env or tools_env(),
        cwd=cwd,
        timeout=240,
    )


def release_args(
    release: FakeRelease,
    s3: S3Server | None = None,
    github: GitHubReleasesServer | None = None,
    s3_endpoint: str | None = None,
) -> list[str]:
    args = [
        "release",
        "--dist",
        str(release.dist),
        "--validate-report",
        str(release.report),
        "--checkout",
        str(release.checkout),
    ]
    if s3 is not None:
        args += ["--s3-bucket", s3.bucket, "--s3-endpoint-url", s3_endpoint or s3.endpoint]
    if github is not None:
        args += [
            "--github-repo",
            GITHUB_REPO,
            "--github-api-url",
            github.url,
            "--github-web-url",
            github.url,
        ]
    return args


def publish_fake(release: FakeRelease, *targets: Any) -> Manifest:
    """Publish the fake release for real (in process) and return its manifest."""
    publish(
        ReleaseRequest(
            dist=release.dist, validate_report=release.report, checkout=release.checkout
        ),
        list(targets),
    )
    return read_manifest(release.dist / MANIFEST_FILE)


def github_target(github: GitHubReleasesServer, tagged: bool = True) -> GitHubTarget:
    """The fake release's GitHub target; `tagged`: its tag is pushed first, as a
    release that is published (not left a draft) needs."""
    if tagged:
        github.push_tag(GITHUB_REPO, f"v{__version__}")
    return GitHubTarget(
        repo=GITHUB_REPO,
        tag=f"v{__version__}",
        token=TOKEN,
        api_url=github.url,
        web_url=github.url,
    )


@pytest.fixture
def published(fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer) -> Manifest:
    """The fake release, published for real to S3 (first mirror) and GitHub (second)."""
    manifest = publish_fake(
        fake_release,
        S3Target(
            bucket=s3.bucket,
            prefix=f"releases/{__version__}",
            endpoint_url=s3.endpoint,
            public_read=True,  # fetch downloads anonymously, as users do
        ),
        github_target(github),
    )
    github.faults.log.clear()  # from here on the log shows only what fetch asked for
    return manifest


@pytest.fixture
def published_with_browser(
    fake_release: FakeRelease, s3: S3Server, github: GitHubReleasesServer
) -> Manifest:
    """The fake release with a browser add-on for linux/amd64 only, published for real
    to S3 (first mirror) and GitHub (second)."""
    fake_release.add_browser(Arch.AMD64)
    manifest = publish_fake(
        fake_release,
        S3Target(
            bucket=s3.bucket,
            prefix=f"releases/{__version__}",
            endpoint_url=s3.endpoint,
            public_read=True,
        ),
        github_target(github),
    )
    github.faults.log.clear()
    return manifest


def wheel_cli(release: FakeRelease, out: Path) -> subprocess.CompletedProcess[str]:
    manifest = str(release.dist / MANIFEST_FILE)
    return run_tools(
        "wheel", "--dist", str(release.dist), "--manifest", manifest, "--out", str(out)
    )
