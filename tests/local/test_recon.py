"""The probe and check scripts run by a real `sh` against prepared directories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandbox_tools.injector.recon import (
    CHECK_SCRIPT,
    PROBE_SCRIPT,
    CandidateStatus,
    InstallVerdict,
    parse_check,
    parse_probe,
)


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
