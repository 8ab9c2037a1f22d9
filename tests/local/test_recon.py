"""The probe and check scripts run by a real `sh` against prepared directories."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from sandbox_tools.injector.recon import (
    CHECK_SCRIPT,
    PROBE_SCRIPT,
    CandidateStatus,
    EarlierInstall,
    InstallVerdict,
    Pin,
    parse_check,
    parse_probe,
    probe_make_argument,
)


def run_script(script: str, *args: str, env: dict[str, str] | None = None) -> bytes:
    done = subprocess.run(
        ["sh", "-c", script, "script", *args],
        capture_output=True,
        timeout=60,
        check=True,
        env=env,
    )
    return done.stdout


TAG = "0123456789abcdef"
TAGS = {os.uname().machine: TAG}


def test_the_probe_makes_the_install_directory_only_where_its_verdicts_chose(
    tmp_path: Path,
) -> None:
    """The install directory is made after the verdicts, in the base the host would
    choose: private before shared; the bases after it are left untested."""
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    shared.chmod(0o1777)
    private.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    dirs = (str(shared), str(private))
    output = run_script(PROBE_SCRIPT, probe_make_argument(TAGS), *dirs)
    recon = parse_probe(output, dirs, tags=TAGS)
    assert recon.made == f"{private}/sandbox-tools-{TAG}"
    assert {c.path: c.status for c in recon.candidates}[str(shared)] is CandidateStatus.UNTESTED
    made = Path(recon.made)
    assert made.is_dir() and not made.is_symlink() and made.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in shared.iterdir()] == []  # nothing made or left in the other


def test_a_name_taken_before_the_probes_mkdir_gets_a_fresh_directory_beside_it(
    tmp_path: Path,
) -> None:
    """Files are never written into a directory someone else could have prepared: a
    name that is taken by the time the probe makes it (here planted by the image's `rm`,
    which the probe runs just before its mkdir, as a racing agent would) is left alone,
    and the probe makes a fresh `mktemp -d` directory beside it instead."""
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    planted = base / f"sandbox-tools-{TAG}"
    tools = tmp_path / "image-bin"
    tools.mkdir()
    (tools / "rm").write_text(f'#!/bin/sh\n/bin/rm "$@"\nmkdir -p {planted}\n')
    (tools / "rm").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    output = run_script(PROBE_SCRIPT, probe_make_argument(TAGS), str(base), env=env)
    recon = parse_probe(output, (str(base),), tags=TAGS)
    assert planted.is_dir() and recon.made.startswith(f"{planted}-")
    assert list(planted.iterdir()) == []  # never written into


def test_an_earlier_install_anywhere_means_the_probe_makes_nothing(tmp_path: Path) -> None:
    """With something at `sandbox-tools-*` in any base, the reuse checks decide first:
    every base is judged, as before, and no directory is made."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(mode=0o755)
    second.mkdir(mode=0o755)
    (second / "sandbox-tools-planted").mkdir()
    tmp_path.chmod(0o755)
    dirs = (str(first), str(second))
    output = run_script(PROBE_SCRIPT, probe_make_argument(TAGS), *dirs)
    recon = parse_probe(output, dirs, tags=TAGS)
    assert recon.made == ""
    assert [c.status for c in recon.candidates[:2]] == [CandidateStatus.OK] * 2
    assert [p.name for p in first.iterdir()] == []


def _earlier_install(base: Path, verify_exit: int, runs: Path) -> Pin:
    """An install of TAG in `base` whose executable answers `verify` with `verify_exit`
    (and records that it ran): the probe checks it against the returned pin."""
    install = base / f"sandbox-tools-{TAG}"
    install.mkdir(mode=0o755)
    exe = install / "sandbox-tools"
    exe.write_text(f'#!/bin/sh\necho "$1" >> {runs}\nexit $(cat "${{0%/*}}/exit")\n')
    exe.chmod(0o755)
    (install / "exit").write_text(str(verify_exit))
    data = exe.read_bytes()
    return Pin(hashlib.sha256(data).hexdigest(), len(data))


def test_the_probe_checks_an_earlier_install_and_stops_at_the_first_that_matches(
    tmp_path: Path,
) -> None:
    """With the artifact's pin, the probe checks the earlier installs itself, in the
    host's order of bases (private before shared), runs `verify` only on one whose
    executable is trusted, and stops at the first whose tree matches: the bases after it
    are left untested, and nothing is made."""
    shared, first, second = tmp_path / "shared", tmp_path / "first", tmp_path / "second"
    shared.mkdir()
    shared.chmod(0o1777)
    first.mkdir(mode=0o755)
    second.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    runs = tmp_path / "runs"
    pin = _earlier_install(first, 1, runs)  # trusted executable, but its tree differs
    assert _earlier_install(second, 0, runs) == pin
    assert _earlier_install(shared, 0, runs) == pin
    dirs = (str(shared), str(first), str(second))
    pins = {os.uname().machine: pin}
    output = run_script(PROBE_SCRIPT, probe_make_argument(TAGS, pins), *dirs)
    recon = parse_probe(output, dirs, tags=TAGS, pins=pins)
    assert recon.earlier == (
        EarlierInstall(str(first), InstallVerdict.TRUSTED, 1),
        EarlierInstall(str(second), InstallVerdict.TRUSTED, 0),
    )
    assert recon.earlier_sha256 == pin.sha256 and recon.made == ""
    assert {c.path: c.status for c in recon.candidates}[str(shared)] is CandidateStatus.UNTESTED
    assert runs.read_text().split() == ["verify", "verify"]


def test_the_probe_runs_nothing_of_an_install_it_does_not_trust(tmp_path: Path) -> None:
    """An executable of other bytes, or one others may write, is never run by the
    probe's check; every base is then judged, so the host can install afresh."""
    base, other = tmp_path / "base", tmp_path / "other"
    base.mkdir(mode=0o755)
    other.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    runs = tmp_path / "runs"
    pin = _earlier_install(base, 0, runs)
    (base / f"sandbox-tools-{TAG}" / "sandbox-tools").write_text("#!/bin/sh\necho ran\n")
    dirs = (str(base), str(other))
    pins = {os.uname().machine: Pin(pin.sha256, pin.size)}
    output = run_script(PROBE_SCRIPT, probe_make_argument(TAGS, pins), *dirs)
    recon = parse_probe(output, dirs, tags=TAGS, pins=pins)
    assert recon.earlier == (EarlierInstall(str(base), InstallVerdict.WRONG_SIZE, None),)
    assert [c.status for c in recon.candidates[:2]] == [CandidateStatus.OK] * 2
    assert not runs.exists()


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
    recon = parse_probe(run_script(PROBE_SCRIPT, "", *dirs), dirs)
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
    recon = parse_probe(run_script(PROBE_SCRIPT, "", str(base)), (str(base),))
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
