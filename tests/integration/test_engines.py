"""Scale-out on existing engines: a second Docker engine, started here on its own socket,
data root and network namespace, stands in for a remote machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.platforms import Arch
from tests.support import cache_without_built_runtimes


@pytest.fixture(scope="module")
def second_engine(docker_engine: Any) -> Iterator[str]:
    """`unix://` URL of a second dockerd. Its own network namespace keeps its bridge apart
    from the first engine's (a second daemon in the same namespace would take docker0)."""
    missing = [tool for tool in ("dockerd", "unshare") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        reason = f"needs root and {', '.join(missing) or 'dockerd, unshare'}"
        if os.environ.get("SANDBOX_TOOLS_REQUIRE_DOCKER") == "1":
            pytest.fail(f"a second engine {reason}")
        pytest.skip(f"a second engine {reason}")
    root = Path(tempfile.mkdtemp(prefix="st-engine-", dir="/tmp"))  # short: socket paths
    socket_path = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    daemon = subprocess.Popen(
        [
            "unshare",
            "--net",
            "--fork",
            "--",
            "dockerd",
            "--host",
            f"unix://{socket_path}",
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "dockerd.pid"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"unix://{socket_path}"
    try:
        for _ in range(120):
            ready = (
                subprocess.run(["docker", "-H", url, "info"], capture_output=True).returncode == 0
            )
            if ready:
                break
            if daemon.poll() is not None:
                break
            time.sleep(0.5)
        else:
            ready = False
        if not ready:
            pytest.fail(
                "the second dockerd did not start:\n" + (root / "dockerd.log").read_text()[-2000:]
            )
        yield url
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def validate(dist: Path, report: Path, *engines: str) -> subprocess.CompletedProcess[str]:
    arch = Arch.parse(os.uname().machine).value
    args = ["--arch", arch, "--only", "debian:12", "--only", "busybox", "--dist", str(dist)]
    args += ["--report", str(report), "--junit", str(report.with_suffix(".xml"))]
    for engine in engines:
        args += ["--engine", engine]
    return subprocess.run(
        [sys.executable, "-m", "sandbox_tools.cli", "validate", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


def rows(report: Path) -> dict[str, set[str]]:
    """distribution -> the engines that ran its cells."""
    found: dict[str, set[str]] = {}
    for result in json.loads(report.read_text())["results"]:
        found.setdefault(result["distro"], set()).add(result["engine"])
    return found


def test_validate_spreads_rows_across_two_engines(
    built_artifacts: Any, second_engine: str, tmp_path: Path
) -> None:
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    report = tmp_path / "report.json"

    result = validate(artifact.parent, report, "default", second_engine)

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    document = json.loads(report.read_text())
    assert document["summary"] == {"passed": 8, "failed": 0, "skipped": 0}
    assert rows(report) == {"debian-12": {"default"}, "busybox": {second_engine}}
    assert [e["label"] for e in document["engines"]] == ["default", second_engine]
    assert f"[{second_engine}]" in result.stdout  # each line says where it ran


def test_an_unreachable_engine_fails_its_rows_and_loses_nothing(
    built_artifacts: Any, tmp_path: Path
) -> None:
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    report = tmp_path / "report.json"
    gone = f"unix://{tmp_path}/no-engine-here.sock"

    result = validate(artifact.parent, report, "default", gone)

    assert result.returncode == 1
    document = json.loads(report.read_text())
    assert document["summary"] == {"passed": 4, "failed": 4, "skipped": 0}
    assert document["engines"][1] == {
        "label": gone,
        "kind": "docker",
        "reachable": False,
        "error": document["engines"][1]["error"],
    }
    failed = [r for r in document["results"] if r["status"] == "failed"]
    assert {r["distro"] for r in failed} == {"busybox"}
    assert all(f"engine {gone} unreachable" in r["detail"] for r in failed)


def test_modal_as_an_engine_without_credentials_fails_its_rows_with_the_remedy(
    built_artifacts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("MODAL_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "no-modal.toml"))
    _record, artifact = built_artifacts(Arch.parse(os.uname().machine))
    report = tmp_path / "report.json"

    result = validate(artifact.parent, report, "default", "modal")

    assert result.returncode == 1
    failed = [r for r in json.loads(report.read_text())["results"] if r["status"] == "failed"]
    assert {r["distro"] for r in failed} == {"busybox"}
    assert all(r["detail"].startswith("engine modal unreachable: ") for r in failed)
    assert all("MODAL_TOKEN_ID" in r["detail"] or "[modal]" in r["detail"] for r in failed)


def test_build_runs_on_the_named_engine(second_engine: str, tmp_path: Path) -> None:
    """Inputs are copied into the builder container, not bind-mounted, so any engine works."""
    from sandbox_tools.artifacts import read_build_records, sha256_of
    from sandbox_tools.build_containers.builder import builder_image_tag

    arch = Arch.parse(os.uname().machine)
    out = tmp_path / "dist"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandbox_tools.cli",
            "build",
            "--arch",
            arch.value,
            "--out",
            str(out),
            "--engine",
            second_engine,
            "--verbose",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        # Not the runtime this host's cache keeps by build id: built on that engine.
        env={
            **os.environ,
            "SANDBOX_TOOLS_CACHE": str(cache_without_built_runtimes(tmp_path / "cache")),
        },
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"building on engine {second_engine}" in result.stdout
    (record,) = read_build_records(out)
    assert sha256_of(out / record.name) == record.sha256
    images = subprocess.run(
        ["docker", "-H", second_engine, "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert builder_image_tag(arch) in images  # built there, smoke-tested there
