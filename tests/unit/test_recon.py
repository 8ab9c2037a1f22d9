"""Reconnaissance output is untrusted data, parsed strictly (THREAT_MODEL.md, first rule:
"fixed keys, each at most once, bounded length, values escaped").

The scripts themselves also run here, in this machine's real sh, against directories
prepared the way an agent would prepare them.
"""

from __future__ import annotations

import pytest

from sandbox_tools.injector.recon import (
    CANDIDATE_DIRS,
    CandidateStatus,
    InstallVerdict,
    ProbeError,
    parse_check,
    parse_probe,
)
from tests.support import GOOD


def test_a_well_formed_probe_parses() -> None:
    recon = parse_probe(GOOD)
    assert (recon.os_id, recon.os_version, recon.uid, recon.libc) == ("debian", "12", 0, "glibc")
    assert [c.path for c in recon.candidates] == [*CANDIDATE_DIRS, "/root"]
    assert recon.candidates[0].has_installs
    assert recon.candidates[3].status is CandidateStatus.NOEXEC
    # Private directories first, the shared (agent-writable) ones only after them.
    assert [c.path for c in recon.install_bases()] == [
        "/opt/sandbox-tools",
        "/root",
        "/var/tmp",
        "/tmp",
    ]


def test_the_os_is_named_without_a_gap_where_the_image_has_no_version() -> None:
    assert parse_probe(GOOD).os_name == "debian 12"
    busybox = GOOD.replace(b"os_id=debian\nos_version=12", b"os_id=linux\nos_version=")
    assert parse_probe(busybox).os_name == "linux"  # was "linux " then a comma


@pytest.mark.parametrize(
    ("forgery", "why"),
    [
        # The review's attack: a marker with a newline added lines to the probe's output.
        (b"uid=1000\n", "twice"),
        (b"install=/tmp/x|0|755|sha256:x y|abc\n", "unexpected line"),
        (b"cand.0=ok|0|755|no\n", "twice"),
        (b"cand.9=ok|0|755|no\n", "unexpected line"),
        (b"no equals sign\n", "unexpected line"),
    ],
)
def test_forged_lines_are_refused(forgery: bytes, why: str) -> None:
    with pytest.raises(ProbeError, match=why):
        parse_probe(GOOD + forgery)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"os_id", b"debian; rm -rf /"),
        (b"uid", b"0" * 80),
        (b"home", b"relative/home"),
        (b"home", b"/ro ot"),
        (b"libc", b"uclibc"),
        (b"cand.0", b"ok|0|755"),
        (b"cand.0", b"trusted|0|755|no"),
        (b"cand.0", b"ok|root|755|no"),
        (b"cand.0", b"ok|0|rwx|no"),
    ],
)
def test_malformed_values_are_refused(key: bytes, value: bytes) -> None:
    lines = [line for line in GOOD.splitlines() if not line.startswith(key + b"=")]
    with pytest.raises(ProbeError):
        parse_probe(b"\n".join([*lines, key + b"=" + value]) + b"\n")


def test_bounds_on_size_and_encoding() -> None:
    with pytest.raises(ProbeError, match="far more"):
        parse_probe(GOOD + b"x" * 70_000)
    with pytest.raises(ProbeError, match="line of"):
        parse_probe(GOOD.replace(b"os_version=12", b"os_version=" + b"1" * 5000))
    with pytest.raises(ProbeError, match="ASCII"):
        parse_probe(GOOD.replace(b"debian", "debi\u00e4n".encode()))
    with pytest.raises(ProbeError, match="lacks"):
        parse_probe(b"arch=x86_64\n")


def test_check_verdicts_are_strict() -> None:
    paths = ("/opt/sandbox-tools/sandbox-tools-abc", "/tmp/sandbox-tools-abc")
    verdicts = parse_check(b"check.0=trusted\ncheck.1=foreign-owner\n", paths)
    assert verdicts == {
        paths[0]: InstallVerdict.TRUSTED,
        paths[1]: InstallVerdict.FOREIGN_OWNER,
    }
    for bad in (
        b"check.0=trusted\n",  # a verdict missing
        b"check.0=trusted\ncheck.0=trusted\ncheck.1=absent\n",
        b"check.0=trusted\ncheck.1=absent\ncheck.2=trusted\n",
        b"check.0=yes\ncheck.1=absent\n",
    ):
        with pytest.raises(ProbeError):
            parse_check(bad, paths)


# -- the scripts, in this machine's sh ------------------------------------------------


def test_parsers_never_raise_anything_but_probe_error() -> None:
    """Hostile bytes from a sandbox give the typed error, never a crash of the host."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=2000))
    def check(blob: bytes) -> None:
        for parse in (lambda: parse_probe(GOOD + blob), lambda: parse_check(blob, ("/x",))):
            try:
                parse()
            except ProbeError:
                pass

    check()
