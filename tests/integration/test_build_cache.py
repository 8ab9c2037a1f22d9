"""The runtime kept by its build id: a second build of the same sources into another
directory (a test run's, a rehearsal's, a second checkout's) copies the first one's
artifact instead of freezing it again (minutes for arm64 under QEMU), and two builds of one
build id at once make it once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.artifacts import Artifact
from sandbox_tools.platforms import Arch
from tests.support import arches_under_test

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]


class Recording:
    """A build reporter that keeps what it is told."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.finished_as: list[tuple[Arch, bool]] = []
        self.stages: list[str] = []
        self._lock = threading.Lock()

    def stage(self, arch: Arch, name: Any) -> None:
        with self._lock:
            self.stages.append(str(name))

    def log(self, arch: Arch, line: str) -> None:
        with self._lock:
            self.lines.append(line)

    def finished(self, arch: Arch, record: Artifact, skipped: bool) -> None:
        with self._lock:
            self.finished_as.append((arch, skipped))


def test_two_builds_into_other_directories_copy_the_runtime_kept_by_its_build_id(
    docker_engine: Any, built_artifacts: Any, tmp_path: Path
) -> None:
    from sandbox_tools.build_containers.build import BuildRequest, build
    from sandbox_tools.sandboxes.containers import ContainerPolicy
    from sandbox_tools.sandboxes.engines import Engine
    from sandbox_tools.sandboxes.images import RootfsStore

    arch = arches_under_test()[0]
    first, first_path = built_artifacts(arch)
    results: dict[str, Artifact] = {}
    reporters = {side: Recording() for side in ("one", "two")}

    def build_into(side: str) -> None:
        request = BuildRequest(
            arches=(arch,),
            format=first.format,
            out_dir=tmp_path / side,
            roots=RootfsStore.from_cascade(),
            containers=ContainerPolicy.from_cascade(),
        )
        (results[side],) = build([Engine("default", docker_engine)], request, reporters[side])

    threads = [threading.Thread(target=build_into, args=(side,)) for side in reporters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    for side, reporter in reporters.items():
        assert results[side] == first, side
        assert reporter.finished_as == [(arch, True)], side
        assert not reporter.stages, (side, reporter.stages)  # no base image, no freeze
        assert any("copied from" in line for line in reporter.lines), reporter.lines
        assert (tmp_path / side / first.name).read_bytes() == first_path.read_bytes()
