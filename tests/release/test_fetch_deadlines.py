"""Mirrors that do not answer, with real loopback servers: one that accepts and never
answers, a port that refuses, one that drops the transfer mid-body. `tools fetch` and the
injector's first acquisition (the same download code) give up a silent mirror after
FIRST_BYTE_TIMEOUT, once, say why in one line, and resume only what was held."""

from __future__ import annotations

import os
import re
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
from tests.release.servers import GitHubReleasesServer, SilentServer, refused_url

TAG = f"v{__version__}"
# docs/CLI.md's command, run here as written (in a directory holding manifest.json).
FETCH_WITH_A_MIRROR = "tools fetch --manifest manifest.json --mirror $MIRROR --out artifacts/"
URLLIB3_WORDS = ("HTTPConnectionPool", "Max retries", "NewConnectionError", "Errno", "urllib3")


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.stop()


def fetch_as_documented(
    release: FakeRelease, cwd: Path, mirror: str, manifest: Manifest | None = None
) -> subprocess.CompletedProcess[str]:
    """docs/CLI.md's `tools fetch --manifest ... --mirror ... --out ...` line, with bash."""
    cwd.mkdir(exist_ok=True)
    if manifest is None:
        shutil.copyfile(release.dist / MANIFEST_FILE, cwd / "manifest.json")
    else:
        (cwd / "manifest.json").write_text(manifest.dumps())
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", FETCH_WITH_A_MIRROR],
        cwd=cwd,
        env=tools_env(MIRROR=mirror, PATH=path),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_mirror_that_never_answers_is_given_up_after_the_first_byte_deadline(
    fake_release: FakeRelease, published: Manifest, silent: SilentServer, tmp_path: Path
) -> None:
    """It held each artifact for 5 minutes (5 tries of 60 s), printing "resuming at 0"."""
    mirror = f"{silent.url}/sandbox-tools"
    started = time.monotonic()

    done = fetch_as_documented(fake_release, tmp_path, mirror)

    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    assert FIRST_BYTE_TIMEOUT - 1 < elapsed < FIRST_BYTE_TIMEOUT + 15, elapsed
    assert silent.connections == 1  # one attempt, and not asked again for the next artifact
    # Artifacts are fetched in the manifest's order: the first waits, the second does not.
    first, second = published.artifacts
    lines = done.stdout.splitlines()
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

    # Nothing else to try: the error lists the reason, once, in the same words.
    alone = replace(published, artifacts=tuple(replace(a, urls=()) for a in published.artifacts))
    failed = fetch_as_documented(fake_release, tmp_path / "alone", mirror, alone)
    assert failed.returncode == 13, failed.stderr + failed.stdout
    error = " ".join(failed.stderr.split())
    first = published.artifacts[0]
    assert f"no source supplied {first.name} ({first.platform}) with the pinned size and " in error
    assert f"SHA-256: {mirror}/{first.name}: connection refused what to do:" in error
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
