"""Ctrl-C during `tools build`: it once kept building to the end, then printed
`KeyboardInterrupt()` and left an artifact without its record. Now it stops at once: the
builder container is removed, nothing half-made stays in the output, one line, exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.cache import cache_root
from sandbox_tools.platforms import Arch
from sandbox_tools.settings import load_settings
from tests.support import arches_under_test, cache_without_built_runtimes


def ctrl_c_as_in_a_terminal() -> None:
    """A job started in the background of a non-interactive shell (as CI may run us)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: restore
    what a terminal gives the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]


def test_ctrl_c_stops_a_build_and_leaves_nothing_half_made(
    docker_engine: Any, built_artifacts: Any, tmp_path: Path
) -> None:
    arch = arches_under_test()[0]
    built_artifacts(arch)  # the builder image and wheelhouse exist: freeze starts quickly
    out = tmp_path / "dist"
    cache = cache_without_built_runtimes(tmp_path / "cache")  # this build must freeze
    build = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_tools.cli",
            "build",
            "--arch",
            arch.value,
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
        env={**os.environ, "SANDBOX_TOOLS_CACHE": str(cache)},
    )
    assert build.stdout is not None
    for line in build.stdout:
        if "freeze ..." in line:
            break
    time.sleep(3)  # inside PyInstaller, in the builder container
    started = time.monotonic()
    build.send_signal(signal.SIGINT)
    stdout, stderr = build.communicate(timeout=120)
    assert build.returncode == 130, stdout + stderr
    assert time.monotonic() - started < 60  # it stopped; a full build takes minutes
    assert "interrupted" in stderr and "KeyboardInterrupt" not in stdout + stderr
    assert "interrupted \n" not in stderr  # a label with nothing after it
    # the stage in progress is not reported done
    assert f"[{arch.value}] freeze: stopped, not done, after" in stdout, stdout
    assert f"[{arch.value}] freeze: done in" not in stdout
    from sandbox_tools.sandboxes.containers import OWNER_LABEL

    mine = {"label": f"{OWNER_LABEL}={build.pid}"}  # only what this process made
    left = docker_engine.containers.list(all=True, ignore_removed=True, filters=mine)
    assert not left, "builder containers were left behind"
    leftovers = [p.name for p in out.iterdir()] if out.exists() else []
    assert leftovers in ([], ["build.json"]), leftovers


def test_a_rebuild_from_a_cleared_cache_gives_the_same_bytes(
    docker_engine: Any, built_artifacts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build id's claim made true. The same sources and locks, rebuilt with
    a cleared cache (wheels downloaded again and checked against their pinned hashes, a
    fresh freeze directory, a fresh output), give byte-identical artifacts. The builder
    root is the one thing kept: it is pinned by its lock, checked whenever it is made."""
    from sandbox_tools.build_containers.build import BuildRequest, NullReporter, build
    from sandbox_tools.sandboxes.containers import ContainerPolicy
    from sandbox_tools.sandboxes.engines import Engine
    from sandbox_tools.sandboxes.images import RootfsStore
    from sandbox_tools.settings import DEFAULT_DEBIAN_MIRROR

    arch = Arch.parse(os.uname().machine)
    first, _ = built_artifacts(arch)
    cleared = tmp_path / "cache"
    cleared.mkdir()
    (cleared / "roots").symlink_to(cache_root(load_settings()) / "roots")
    request = BuildRequest(
        arches=(arch,),
        format=first.format,
        out_dir=tmp_path / "again",
        roots=RootfsStore(cleared, DEFAULT_DEBIAN_MIRROR),
        containers=ContainerPolicy(),
    )
    (second,) = build([Engine("default", docker_engine)], request, NullReporter())
    assert (cleared / "wheelhouse").is_dir()  # the wheels really came again
    assert (second.build_id, second.sha256, second.size) == (
        first.build_id,
        first.sha256,
        first.size,
    )
