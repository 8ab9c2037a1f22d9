"""Reconnaissance output is untrusted data, parsed strictly (THREAT_MODEL.md, first rule:
"fixed keys, each at most once, bounded length, values escaped").

The scripts themselves also run here, in this machine's real sh, against directories
prepared the way an agent would prepare them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandbox_tools.injector.recon import (
    CANDIDATE_DIRS,
    CHECK_SCRIPT,
    PROBE_SCRIPT,
    CandidateStatus,
    InstallVerdict,
    ProbeError,
    parse_check,
    parse_probe,
)

GOOD = b"""os_id=debian
os_version=12
arch=x86_64
libc=glibc
uid=0
user=root
sha256sum=yes
home=/root
cand.0=ok|0|755|yes
cand.1=ok|0|1777|no
cand.2=ok|0|1777|no
cand.3=noexec|0|1777|no
cand.4=ok|0|700|no
"""


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


def run_script(script: str, *args: str) -> bytes:
    done = subprocess.run(
        ["sh", "-c", script, "script", *args], capture_output=True, timeout=60, check=True
    )
    return done.stdout


def test_probe_verdicts_for_prepared_directories(tmp_path: Path) -> None:
    """Rule: install only where the agent cannot write (owner, mode and every parent)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o755)
    group_writable = tmp_path / "group"
    group_writable.mkdir()
    group_writable.chmod(0o775)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    below_writable = group_writable / "inner"
    below_writable.mkdir(mode=0o755)
    link = tmp_path / "link"
    link.symlink_to(private)
    dirs = (str(private), str(group_writable), str(sticky), str(below_writable), str(link))
    tmp_path.chmod(0o755)
    recon = parse_probe(run_script(PROBE_SCRIPT, *dirs), dirs)
    status = {c.path: c.status for c in recon.candidates}
    assert status[str(private)] is CandidateStatus.OK
    assert status[str(group_writable)] is CandidateStatus.WRITABLE_ANCESTOR
    assert status[str(sticky)] is CandidateStatus.OK
    assert status[str(below_writable)] is CandidateStatus.WRITABLE_ANCESTOR
    assert status[str(link)] is CandidateStatus.MISSING  # a symlink is never followed
    assert [p.name for p in private.iterdir()] == []  # the scratch directory is gone


def test_probe_scratch_is_private_and_ignores_planted_names(tmp_path: Path) -> None:
    """Rule: scratch space is private; a symlink or FIFO at any predictable name is
    neither followed nor opened (the old probe wrote through `.sandbox-tools-probe-$$`)."""
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for pid in range(os.getpid(), os.getpid() + 400):
        (base / f".sandbox-tools-probe-{pid}").symlink_to(victim)
    os.mkfifo(base / ".sandbox-tools-probe.fifo")
    os.mkfifo(base / "sandbox-tools-planted")
    recon = parse_probe(run_script(PROBE_SCRIPT, str(base)), (str(base),))
    assert recon.candidates[0].status is CandidateStatus.OK
    assert recon.candidates[0].has_installs  # something is there: the check decides
    assert victim.read_text() == "precious\n"


def test_check_script_trusts_only_our_exact_bytes(tmp_path: Path) -> None:
    """Rule: reuse only after owner, mode and digest checks by a separate fixed command."""
    import hashlib

    tmp_path.chmod(0o755)
    data = b"#!/bin/sh\necho runtime\n"
    digest = hashlib.sha256(data).hexdigest()
    uid = str(os.geteuid())

    def install(name: str, content: bytes = data, dir_mode: int = 0o755) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "sandbox-tools").write_bytes(content)
        (path / "sandbox-tools").chmod(0o755)
        path.chmod(dir_mode)
        return str(path)

    good = install("good")
    tampered = install("tampered", b"#!/bin/sh\necho pwned!!\n")  # same size
    loose = install("loose", dir_mode=0o777)
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "sandbox-tools")  # would hang sha256sum: never opened
    paths = (good, tampered, loose, str(fifo_dir), str(tmp_path / "absent"))
    out = run_script(CHECK_SCRIPT, digest, str(len(data)), uid, *paths)
    assert parse_check(out, paths) == {
        good: InstallVerdict.TRUSTED,
        tampered: InstallVerdict.WRONG_DIGEST,
        loose: InstallVerdict.WRITABLE_BY_OTHERS,
        str(fifo_dir): InstallVerdict.NO_EXECUTABLE,
        str(tmp_path / "absent"): InstallVerdict.ABSENT,
    }
    # Owned by another uid than the runtime's: not ours, whatever its bytes.
    out = run_script(CHECK_SCRIPT, digest, str(len(data)), "4242", good)
    assert parse_check(out, (good,)) == {good: InstallVerdict.FOREIGN_OWNER}


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
