"""docs/RELEASING.md's rehearsal, run as a maintainer runs it, in its browser variant:
`bash scripts/release_rehearsal.sh --with-browser --only busybox` builds the runtime and
the browser add-on of both platforms into the checkout's dist/, validates them (debian-12
and the libc-free busybox; the add-ons' browser cells as root and as uid 1000 on both
architectures, arm64 under QEMU), releases to the local S3 and GitHub stand-ins (draft,
then published with everything identical), fetches from both, bundles, fetches offline
and installs the wheel. Every count it checks comes from build.json and the release's
own output, so this one run shows the variant with add-ons; the script's own checks are
what fails it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from sandbox_tools.artifacts import ArtifactKind, read_build_records
from sandbox_tools.platforms import Arch
from tests.support import arches_under_test

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.journey, pytest.mark.timeout(3600)]


@pytest.mark.skipif(
    Arch.ARM64 not in arches_under_test(),
    reason="the rehearsal builds and validates both platforms: arm64 runs under QEMU "
    "(SANDBOX_TOOLS_TEST_ARM64=1, as scripts/test.sh sets it)",
)
def test_the_rehearsal_with_the_browser_add_ons_of_both_platforms() -> None:
    """Journey: docs/RELEASING.md "0. Rehearse" with `--with-browser`."""
    done = subprocess.run(
        ["bash", "scripts/release_rehearsal.sh", "--with-browser", "--only", "busybox"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3500,
        env={**os.environ, "NO_COLOR": "1"},
    )
    tail = done.stdout[-6000:] + done.stderr[-6000:]
    assert done.returncode == 0, tail
    assert "== rehearsal complete" in done.stdout, tail
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("browser cells passed: ")]
    passed = set(line.removeprefix("browser cells passed: ").split(", "))
    assert passed == {
        f"{distro}/{arch.value}/browser-{user}"
        for distro in ("debian-12", "busybox")
        for arch in Arch
        for user in ("root", "nonroot")
    }, line
    addons = [r for r in read_build_records(ROOT / "dist") if r.kind is ArtifactKind.BROWSER]
    assert {a.arch for a in addons} == set(Arch)
    # Each add-on went to both places, then was fetched from each and from the bundle.
    for addon in addons:
        uploads = re.findall(rf"^\S+/{re.escape(addon.name)}: uploaded$", done.stdout, re.M)
        assert len(uploads) == 2, (addon.name, tail)
        assert f"{addon.name}: OK" in done.stdout  # sha256sum -c, after each fetch
