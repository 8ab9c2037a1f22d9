"""When the probe's waiting shell may go on (inject.py, `_the_probes_shell_can_go_on`):
only to what its own script does, with the facts it printed and the pin it was given.
Anything else is declined and the injection goes on step by step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.injector.inject import _install_path, _the_probes_shell_can_go_on
from sandbox_tools.injector.recon import EarlierInstall, InstallVerdict, Pin, parse_probe
from sandbox_tools.platforms import Arch
from tests.support import GOOD

ARTIFACT = Artifact(
    name="sandbox-tools",
    arch=Arch.AMD64,
    format=ArtifactFormat.PORTABLE,
    size=8_929_920,
    sha256="cd" * 32,
    build_id="sha256:" + "ab" * 32,
)
PIN = Pin(ARTIFACT.sha256, ARTIFACT.size)
MADE = _install_path("/opt/sandbox-tools", ARTIFACT)
FRESH = replace(parse_probe(GOOD), pin=PIN)  # the facts of a probe given the artifact's pin


SIZE = ARTIFACT.size


def test_a_fresh_install_goes_on_with_the_pinned_artifact_only() -> None:
    assert _the_probes_shell_can_go_on(FRESH, ARTIFACT, None, MADE, SIZE)
    for artifact in (replace(ARTIFACT, sha256="ef" * 32), replace(ARTIFACT, size=1)):
        assert not _the_probes_shell_can_go_on(FRESH, artifact, None, MADE, SIZE)
    assert not _the_probes_shell_can_go_on(replace(FRESH, pin=None), ARTIFACT, None, MADE, SIZE)
    # Bytes at hand of another length than the pin (a file changed under its record):
    # the shell would wait for the rest; the host goes on step by step instead.
    assert not _the_probes_shell_can_go_on(FRESH, ARTIFACT, None, MADE, SIZE - 1)


@pytest.mark.parametrize("lacking", ["a made directory", "a byte-counting head", "sha256sum"])
def test_a_fresh_install_needs_what_the_script_needs(lacking: str) -> None:
    recon, made = FRESH, MADE
    if lacking == "a made directory":
        made = ""
    elif lacking == "a byte-counting head":
        recon = replace(recon, has_head_bytes=False)
    else:
        recon = replace(recon, has_sha256sum=False)
    assert not _the_probes_shell_can_go_on(recon, ARTIFACT, None, made, SIZE)


def reused(verdict: InstallVerdict, tree_exit: int | None, sha256: str = PIN.sha256) -> bool:
    earlier = (EarlierInstall("/opt/sandbox-tools", verdict, tree_exit),)
    recon = replace(FRESH, earlier=earlier, earlier_sha256=sha256)
    return _the_probes_shell_can_go_on(recon, ARTIFACT, MADE, "")


def test_a_reuse_goes_on_only_to_the_install_the_shell_checked_whole() -> None:
    assert reused(InstallVerdict.TRUSTED, 0)
    assert not reused(InstallVerdict.TRUSTED, 1)  # its tree is not its payload
    assert not reused(InstallVerdict.UNVERIFIED, None)  # the host reads it back itself
    assert not reused(InstallVerdict.TRUSTED, 0, sha256="ef" * 32)  # checked for another
    earlier = (EarlierInstall("/var/tmp", InstallVerdict.TRUSTED, 0),)
    recon = replace(FRESH, earlier=earlier, earlier_sha256=PIN.sha256)
    assert not _the_probes_shell_can_go_on(recon, ARTIFACT, MADE, "")  # not the host's choice
