"""Mirrors that do not answer, with real loopback servers: one that accepts and never
answers, a port that refuses, one that drops the transfer mid-body. `tools fetch` and the
injector's first acquisition (the same download code) give up a silent mirror after
FIRST_BYTE_TIMEOUT, once, say why in one line, and resume only what was held."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_tools import __version__
from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.acquire import Mirrors, acquire_artifact
from sandbox_tools.platforms import Arch
from sandbox_tools.release.fetch import FIRST_BYTE_TIMEOUT
from sandbox_tools.release.manifest import MANIFEST_FILE, Manifest, manifest_from_records
from tests.release.conftest import GITHUB_REPO, FakeRelease, tools_env
from tests.release.servers import (
    GitHubReleasesServer,
    ShortFileServer,
    SilentServer,
    refused_url,
)

TAG = f"v{__version__}"
# docs/CLI.md's command, run here as written (in a directory holding manifest.json).
FETCH_WITH_A_MIRROR = "tools fetch --manifest manifest.json --mirror $MIRROR --out artifacts/"
URLLIB3_WORDS = ("HTTPConnectionPool", "Max retries", "NewConnectionError", "Errno", "urllib3")


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.stop()


def start_as_documented(
    release: FakeRelease, cwd: Path, mirror: str, manifest: Manifest | None = None
) -> subprocess.Popen[str]:
    """docs/CLI.md's `tools fetch --manifest ... --mirror ... --out ...` line, with bash,
    started (its output read as it comes)."""
    cwd.mkdir(exist_ok=True)
    if manifest is None:
        shutil.copyfile(release.dist / MANIFEST_FILE, cwd / "manifest.json")
    else:
        (cwd / "manifest.json").write_text(manifest.dumps())
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", FETCH_WITH_A_MIRROR],
        cwd=cwd,
        env=tools_env(MIRROR=mirror, PATH=path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def fetch_as_documented(
    release: FakeRelease, cwd: Path, mirror: str, manifest: Manifest | None = None
) -> subprocess.CompletedProcess[str]:
    """The same, run to the end."""
    process = start_as_documented(release, cwd, mirror, manifest)
    stdout, stderr = process.communicate(timeout=240)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_a_mirror_that_never_answers_is_given_up_after_the_first_byte_deadline(
    fake_release: FakeRelease, published: Manifest, silent: SilentServer, tmp_path: Path
) -> None:
    """It held each artifact for 5 minutes (5 tries of 60 s), printing "resuming at 0"."""
    mirror = f"{silent.url}/sandbox-tools"
    started = time.monotonic()

    process = start_as_documented(fake_release, tmp_path, mirror)
    # The terminal was blank while the mirror was silent: each source is named before it
    # is tried, at normal verbosity.
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 5)
    assert ready, "nothing printed within 5 s"
    first_line = process.stdout.readline().rstrip("\n")
    said_after = time.monotonic() - started
    stdout, stderr = process.communicate(timeout=240)
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    elapsed = time.monotonic() - started
    first, second = published.artifacts
    assert first_line == f"{first.name}: trying {mirror}/{first.name}", first_line
    assert said_after < FIRST_BYTE_TIMEOUT / 2, said_after
    assert done.returncode == 0, done.stderr + done.stdout
    assert FIRST_BYTE_TIMEOUT - 1 < elapsed < FIRST_BYTE_TIMEOUT + 15, elapsed
    assert silent.connections == 1  # one attempt, and not asked again for the next artifact
    # Artifacts are fetched in the manifest's order: the first waits, the second does not.
    lines = [first_line, *done.stdout.splitlines()]
    assert (
        f"{first.name}: {mirror}/{first.name}: no answer within {FIRST_BYTE_TIMEOUT:g} s; "
        f"trying {first.urls[0]}"
    ) in lines, done.stdout
    assert (
        f"{second.name}: {mirror}/{second.name}: not asked ({silent.url}: no answer within "
        f"{FIRST_BYTE_TIMEOUT:g} s, just before); trying {second.urls[0]}"
    ) in lines, done.stdout
    assert "resuming" not in done.stdout + done.stderr
    for artifact in published.artifacts:
        assert f"linux/{artifact.arch.value}/{artifact.name}: fetched from" in done.stdout


def test_a_refused_port_is_one_clean_line(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    """A refused connection showed urllib3's message (HTTPConnectionPool(...): Max retries
    exceeded ... NewConnectionError ... [Errno 111]), after five tries."""
    mirror = f"{refused_url()}/sandbox-tools"

    done = fetch_as_documented(fake_release, tmp_path / "with-others", mirror)

    assert done.returncode == 0, done.stderr + done.stdout
    server = mirror.rsplit("/", 1)[0]
    first, second = published.artifacts
    said = [line for line in done.stdout.splitlines() if f": {mirror}/" in line]
    assert said == [
        f"{first.name}: {mirror}/{first.name}: connection refused; trying {first.urls[0]}",
        f"{second.name}: {mirror}/{second.name}: not asked ({server}: connection refused, "
        f"just before); trying {second.urls[0]}",
    ], done.stdout
    for word in URLLIB3_WORDS:
        assert word not in done.stdout + done.stderr

    # Nothing else to try: the error lists the reasons, once, in the same words, for every
    # artifact (each was tried, the first failure did not stop the second).
    alone = replace(published, artifacts=tuple(replace(a, urls=()) for a in published.artifacts))
    failed = fetch_as_documented(fake_release, tmp_path / "alone", mirror, alone)
    assert failed.returncode == 13, failed.stderr + failed.stdout
    error = " ".join(failed.stderr.split())
    first = published.artifacts[0]
    assert (
        f"2 of 2 artifacts could not be fetched: {first.name} ({first.platform}), "
        f"{second.name} ({second.platform}):" in error
    )
    assert f"no source supplied {first.name} ({first.platform}) with the pinned size and " in error
    assert f"SHA-256: {mirror}/{first.name}: connection refused no source supplied" in error
    assert f"SHA-256: {mirror}/{second.name}: not asked ({server}: connection refused" in error
    for word in URLLIB3_WORDS:
        assert word not in failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr


def test_a_transfer_dropped_mid_body_resumes_from_the_bytes_held(
    fake_release: FakeRelease, published: Manifest, github: GitHubReleasesServer, tmp_path: Path
) -> None:
    arm64 = published.for_platform("linux/arm64")
    github.faults.truncate[arm64.name] = [150_000]  # once, then whole
    mirror = f"{github.url}/{GITHUB_REPO}/releases/download/{TAG}"

    done = fetch_as_documented(fake_release, tmp_path, mirror)

    assert done.returncode == 0, done.stderr + done.stdout
    resumed = re.findall(r"resuming at ([\d,]+) of ([\d,]+) bytes", done.stdout)
    assert len(resumed) == 1, done.stdout
    held, total = (int(n.replace(",", "")) for n in resumed[0])
    assert 0 < held <= 150_000 and total == arm64.size
    ranges = [line for line in github.faults.log if arm64.name in line and "bytes=" in line]
    assert ranges == [f"GET /{GITHUB_REPO}/releases/download/{TAG}/{arm64.name} bytes={held}-"]


def test_the_injector_gives_up_silent_and_refusing_mirrors_within_the_deadline(
    fake_release: FakeRelease, silent: SilentServer, tmp_path: Path
) -> None:
    """The first injection of a git-ref install downloads with the same code: a dead proxy
    held each sample's first tool call for minutes."""
    refused = refused_url()
    manifest = manifest_from_records(
        __version__, fake_release.records, [f"{silent.url}/m", f"{refused}/m"]
    )
    started = time.monotonic()

    with pytest.raises(SandboxInjectionError) as failed:
        acquire_artifact(Arch.AMD64, sources=[Mirrors(tmp_path / "cache", manifest, False)])

    elapsed = time.monotonic() - started
    assert FIRST_BYTE_TIMEOUT - 1 < elapsed < FIRST_BYTE_TIMEOUT + 10, elapsed
    assert silent.connections == 1
    message = failed.value.message
    assert f"{silent.url}/m/" in message
    assert f"no answer within {FIRST_BYTE_TIMEOUT:g} s" in message
    assert f"{refused}/m/" in message and "connection refused" in message
    for word in URLLIB3_WORDS:
        assert word not in message


@pytest.mark.parametrize("ranges", [True, False], ids=["honours-range", "ignores-range"])
def test_a_complete_but_short_file_is_the_wrong_size_at_once(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path, ranges: bool
) -> None:
    """A mirror's whole file, shorter than the manifest's (Content-Length: 1000, then the
    connection closes), was taken for a dropped connection: five tries "resuming at 1,000",
    or "HTTP 416 for a resume" from a server honouring Range. It is a wrong size: said at
    once, and the next source is tried."""
    server = ShortFileServer(size=1000, ranges=ranges)
    try:
        mirror = f"{server.url}/sandbox-tools"
        done = fetch_as_documented(fake_release, tmp_path, mirror)
    finally:
        server.stop()

    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    for artifact in published.artifacts:
        assert (
            f"{artifact.name}: {mirror}/{artifact.name}: 1,000 bytes, the manifest pins "
            f"{artifact.size:,}; trying {artifact.urls[0]}"
        ) in lines, done.stdout
        assert f"{artifact.platform}/{artifact.name}: fetched from {artifact.urls[0]}" in lines
    for word in ("resuming", "HTTP 416", "attempts"):
        assert word not in done.stdout + done.stderr
    assert len(server.faults.log) == 2  # one request per artifact, no resume


def test_a_failing_artifact_does_not_stop_the_others(
    fake_release: FakeRelease, published: Manifest, tmp_path: Path
) -> None:
    """The first artifact that failed ended the fetch (exit 13): the others were neither
    tried nor reported. Now each is tried, each failure said, and the exit names them."""
    first, second = published.artifacts
    pinned = "0" * 64
    wrong = replace(
        published,
        artifacts=tuple(
            replace(a, sha256=pinned) if a is first else a for a in published.artifacts
        ),
    )
    mirror = f"{refused_url()}/sandbox-tools"

    done = fetch_as_documented(fake_release, tmp_path, mirror, wrong)

    assert done.returncode == 13, done.stderr + done.stdout
    error = " ".join(done.stderr.split())
    assert (
        f"1 of 2 artifacts could not be fetched: {first.name} ({first.platform}) "
        f"({second.name} verified in artifacts):" in error
    ), error
    assert f"{first.urls[0]}: sha256 {first.sha256}, the manifest pins {pinned}" in error
    assert (
        f"{first.name}: no source supplied it (why: below); going on with the 1 other artifact"
        in done.stdout.splitlines()
    )
    assert f"{second.name}: trying {mirror}/{second.name}" not in done.stdout  # not asked
    assert (tmp_path / "artifacts" / second.name).is_file()
    assert not (tmp_path / "artifacts" / first.name).exists()
