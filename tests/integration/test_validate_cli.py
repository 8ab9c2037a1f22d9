"""`tools validate` as a user runs it: the real CLI, real containers, real reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from sandbox_tools.validation import ValidationReport
from tests.support import arches_under_test


def ctrl_c_as_in_a_terminal() -> None:
    """A job started in the background of a non-interactive shell (as CI may run us)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: restore
    what a terminal gives the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]


def tools(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, **(env or {})},
    )


def test_validate_offline_rows_and_reports(built_artifacts: Any, tmp_path: Path) -> None:
    arch = arches_under_test()[0]
    record, artifact = built_artifacts(arch)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    done = tools(
        "validate",
        "--dist",
        str(artifact.parent),
        "--arch",
        arch.value,
        "--only",
        "debian:12",
        "--only",
        "busybox",
        "--only",
        "ubuntu-24.04",
        "--report",
        str(report),
        "--junit",
        str(junit),
    )
    document = json.loads(report.read_text())
    assert document["artifacts"] == [record.to_json()]  # the exact bytes validated
    assert ValidationReport.load(report).artifacts == [record]
    statuses = {r["id"]: r["status"] for r in document["results"]}
    host = arch.value
    for distro in ("debian-12", "busybox"):
        for scenario in ("root", "nonroot", "readonly-exec-tmpfs", "readonly-noexec"):
            assert statuses[f"{distro}/{host}/{scenario}"] == "passed"
    ubuntu = [r for r in document["results"] if r["distro"] == "ubuntu-24.04"]
    suite = ElementTree.parse(junit).getroot()
    # 12 cells, and the artifact's static checks as a case of their own.
    assert suite.get("tests") == "13" and suite.get("failures") == "0"
    if all(r["source"].startswith("registry") for r in ubuntu):
        # A machine that can pull: the registry row runs like any other.
        assert done.returncode == 0, done.stdout + done.stderr
        assert document["passed"] is True and document["unvalidated"] == []
        assert {r["status"] for r in ubuntu} == {"passed"}
        assert suite.get("skipped") == "0"
        return
    # No registry here: ubuntu was asked for and every one of its cells was skipped, never
    # faked, so the run fails with its own code even though nothing failed.
    assert done.returncode == 15, done.stdout + done.stderr
    assert "nothing passed for: ubuntu-24.04" in done.stderr
    assert document["passed"] is False and document["unvalidated"] == ["ubuntu-24.04"]
    assert {r["status"] for r in ubuntu} == {"skipped"}
    # The reason names both sources that were tried (the pull error is included when the
    # row was the one that found the registry unreachable).
    assert ubuntu[0]["detail"].startswith("registry unreachable")
    assert ubuntu[0]["detail"].endswith("no offline recipe")
    assert suite.get("skipped") == "4"


def test_static_checks_refuse_a_broken_artifact(built_artifacts: Any, tmp_path: Path) -> None:
    import shutil

    arch = arches_under_test()[0]
    _, artifact = built_artifacts(arch)
    dist = tmp_path / "dist"
    shutil.copytree(artifact.parent, dist)
    assert tools("validate", "--static", "--dist", str(dist)).returncode == 0
    (dist / artifact.name).write_bytes(b"#!/bin/sh\necho not an artifact\n")
    done = tools("validate", "--static", "--dist", str(dist))
    assert done.returncode != 0
    assert "does not match its record" in done.stdout + done.stderr


def test_validate_never_goes_green_having_validated_nothing(
    built_artifacts: Any, tmp_path: Path
) -> None:
    """`--only ubuntu` with the registry unreachable exited 0 with a report saying
    "passed": true; an early error left the previous green report in place."""
    arch = arches_under_test()[0]
    _record, artifact = built_artifacts(arch)
    report, junit = tmp_path / "deep" / "report.json", tmp_path / "deep" / "junit.xml"
    common = ["validate", "--dist", str(artifact.parent), "--arch", arch.value, "--only", "ubuntu"]
    paths = ["--report", str(report), "--junit", str(junit)]
    summary = tmp_path / "summary.md"
    skipped_only = tools(
        *common, *paths, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    )
    if skipped_only.returncode == 0 and json.loads(report.read_text())["passed"]:
        pytest.skip("the registry is reachable here; this case needs a machine where it is not")
    assert skipped_only.returncode == 15, skipped_only.stdout + skipped_only.stderr
    # On GitHub Actions: cell lines grouped, the verdict as an error annotation, a summary.
    assert "::group::tools validate: cells" in skipped_only.stdout
    assert "::error title=tools validate::nothing passed for ubuntu" in skipped_only.stdout
    assert summary.read_text().startswith("## tools validate: failed")
    assert json.loads(report.read_text())["passed"] is False  # parents were created
    allowed = tools(*common, *paths, "--allow-skipped", "--json")
    assert allowed.returncode == 0 and json.loads(report.read_text())["passed"] is True
    assert json.loads(allowed.stdout) == json.loads(report.read_text())  # stdout: JSON only
    early = tools(*common, *paths, "--jobs", "0")
    assert early.returncode == 2 and "Traceback" not in early.stderr
    bad_arch = tools("validate", "--dist", str(artifact.parent), "--arch", "sparc", *paths)
    assert bad_arch.returncode == 2 and "Traceback" not in bad_arch.stderr
    assert not report.exists() and not junit.exists()  # no stale green report stands


def test_ctrl_c_writes_a_partial_report_and_leaves_no_containers(
    docker_engine: Any, built_artifacts: Any, tmp_path: Path
) -> None:
    """Validate exited 130 silently with no report (and the previous one left)."""

    arch = arches_under_test()[0]
    _record, artifact = built_artifacts(arch)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    report.write_text('{"passed": true}')  # a stale green report must not survive
    validate = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_tools.cli",
            "validate",
            "--dist",
            str(artifact.parent),
            "--arch",
            arch.value,
            "--only",
            "debian",
            "--jobs",
            "1",
            "--report",
            str(report),
            "--junit",
            str(junit),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    assert validate.stdout is not None
    for line in validate.stdout:
        if line.startswith("passed"):  # one cell done, others still to run
            break
    validate.send_signal(signal.SIGINT)
    _, stderr = validate.communicate(timeout=300)
    assert validate.returncode == 130 and "interrupted" in stderr, stderr
    document = json.loads(report.read_text())
    assert document["interrupted"] is True and document["passed"] is False
    assert document["summary"]["passed"] >= 1
    from sandbox_tools.sandboxes.containers import OWNER_LABEL

    mine = {"label": f"{OWNER_LABEL}={validate.pid}"}  # only what this process made
    left = docker_engine.containers.list(all=True, ignore_removed=True, filters=mine)
    assert not left, "validate left containers behind"
