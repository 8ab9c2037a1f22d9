"""Reconnaissance output is untrusted data, parsed strictly (THREAT_MODEL.md, first rule:
"fixed keys, each at most once, bounded length, values escaped").

The scripts themselves also run here, in this machine's real sh, against directories
prepared the way an agent would prepare them.
"""

from __future__ import annotations

import pytest

from sandbox_tools.injector.recon import (
    CANDIDATE_DIRS,
    Candidate,
    CandidateStatus,
    EarlierInstall,
    InstallVerdict,
    Pin,
    ProbeError,
    parse_check,
    parse_probe,
    probe_make_argument,
)
from tests.support import GOOD, PROBE_HEADER


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


# -- the install directory the probe makes ------------------------------------------

TAGS = {"x86_64": "0123456789abcdef", "aarch64": "fedcba9876543210"}
# A fresh Debian container as root, nothing installed before: the probe judged
# /opt/sandbox-tools usable, made the directory there and left the rest untested.
MADE = (
    PROBE_HEADER
    + b"""cand.0=ok|0|755|no
cand.1=untested|0|1777|no
cand.2=untested|0|1777|no
cand.3=untested|0|1777|no
cand.4=untested|0|700|no
made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef|0|755
"""
)


def test_the_directory_the_probe_made_is_taken_when_it_is_what_was_asked() -> None:
    recon = parse_probe(MADE, tags=TAGS)
    assert recon.made == "/opt/sandbox-tools/sandbox-tools-0123456789abcdef"
    assert [c.path for c in recon.install_bases()] == ["/opt/sandbox-tools"]
    fresh = MADE.replace(b"0123456789abcdef|", b"0123456789abcdef-Ab3dE9xZ|")
    assert parse_probe(fresh, tags=TAGS).made.endswith("-Ab3dE9xZ")
    assert parse_probe(GOOD, tags=TAGS).made == ""  # an earlier install: nothing made


@pytest.mark.parametrize(
    ("made", "why"),
    [
        # Not in the base the host would choose from the verdicts (/opt/sandbox-tools).
        (b"made=/tmp/sandbox-tools-0123456789abcdef|0|755", "not /opt"),
        # Another tag, another machine's tag, or a name that is not a fresh one beside it.
        (b"made=/opt/sandbox-tools/sandbox-tools-0000000000000000|0|755", "not /opt"),
        (b"made=/opt/sandbox-tools/sandbox-tools-fedcba9876543210|0|755", "not /opt"),
        (b"made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef-x/../y|0|755", "not /opt"),
        (b"made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef/sub|0|755", "not /opt"),
        # Somebody else's, or one others may write: never written into.
        (b"made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef|1000|755", "uid's 0755"),
        (b"made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef|0|777", "uid's 0755"),
        (b"made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef|0|", "uid's 0755"),
    ],
)
def test_a_made_directory_other_than_the_one_asked_for_is_refused(made: bytes, why: str) -> None:
    forged = MADE.replace(b"made=/opt/sandbox-tools/sandbox-tools-0123456789abcdef|0|755", made)
    with pytest.raises(ProbeError, match=why):
        parse_probe(forged, tags=TAGS)


def test_a_made_directory_nobody_asked_for_is_refused() -> None:
    with pytest.raises(ProbeError, match="not asked for"):
        parse_probe(MADE)  # no tags given: the probe was not to make anything
    no_base = MADE.replace(b"cand.0=ok|0|755|no", b"cand.0=noexec|0|755|no")
    with pytest.raises(ProbeError, match="not asked for"):
        parse_probe(no_base, tags=TAGS)


def test_only_machine_names_and_hex_tags_reach_the_probe() -> None:
    assert probe_make_argument(TAGS) == "x86_64=0123456789abcdef aarch64=fedcba9876543210"
    for bad in ({"x86_64": "ab cd"}, {"x86 64": "abcd"}, {"x86_64": "$(id)"}):
        with pytest.raises(ValueError):
            probe_make_argument(bad)


PIN = Pin("cd" * 32, 8_929_920)
PINS = {"x86_64": PIN}


def test_the_probes_own_checks_of_earlier_installs_parse() -> None:
    recon = parse_probe(GOOD + b"check.0=trusted|0\n", pins=PINS)
    assert recon.earlier == (EarlierInstall("/opt/sandbox-tools", InstallVerdict.TRUSTED, 0),)
    assert recon.earlier_sha256 == PIN.sha256
    assert probe_make_argument({"x86_64": "ab"}, PINS) == f"x86_64=ab:{PIN.sha256}:{PIN.size}"


@pytest.mark.parametrize(
    ("line", "pins"),
    [
        (b"check.0=trusted|0\n", None),  # nothing was pinned: nothing could be checked
        (b"check.1=trusted|0\n", PINS),  # /var/tmp holds no install
        (b"check.3=trusted|0\n", PINS),  # /tmp is not usable (noexec)
        (b"check.0=trusted|-\n", PINS),  # trusted, yet `verify` did not run
        (b"check.0=wrong-digest|0\n", PINS),  # `verify` ran on an untrusted executable
        (b"check.0=trusted|x\n", PINS),
        (b"check.0=trusted\n", PINS),
        (b"check.0=mine|-\n", PINS),
        (b"check.0=trusted|0\ncheck.0=trusted|0\n", PINS),
    ],
)
def test_a_forged_check_of_an_earlier_install_is_refused(
    line: bytes, pins: dict[str, Pin] | None
) -> None:
    with pytest.raises(ProbeError):
        parse_probe(GOOD + line, pins=pins)


def test_a_mode_stat_prints_without_leading_zeros_is_read_as_the_mode_it_is() -> None:
    """`stat -c %a` prints 0077 as "77": a candidate of such a mode parses, and counts as
    writable by others (the probe pads it the same way before judging ancestors)."""
    assert Candidate("/x", CandidateStatus.OK, 0, "77").shared
    assert Candidate("/x", CandidateStatus.OK, 0, "7").shared
    assert Candidate("/x", CandidateStatus.OK, 0, "1777").shared
    assert not Candidate("/x", CandidateStatus.OK, 0, "755").shared
    assert not Candidate("/x", CandidateStatus.OK, 0, "").shared
    odd = GOOD.replace(b"cand.1=ok|0|1777|no", b"cand.1=ok|0|77|no")
    assert parse_probe(odd).candidates[1].mode == "77"
