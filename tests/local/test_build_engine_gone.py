"""A build whose Docker engine stops answering says so, and how to check it, instead of
a ConnectionError's repr under "see the build log above"."""

from __future__ import annotations

from pathlib import Path

import pytest
from docker import DockerClient

from sandbox_tools.artifacts import ArtifactFormat
from sandbox_tools.build_containers.build import BuildRequest, NullReporter, build
from sandbox_tools.errors import BuildError
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import ContainerPolicy
from sandbox_tools.sandboxes.engines import Engine
from sandbox_tools.sandboxes.images import RootfsStore


def test_an_engine_that_stopped_answering_is_named_with_what_to_check(tmp_path: Path) -> None:
    gone = tmp_path / "docker.sock"  # nothing listens here: the engine went away
    client = DockerClient(base_url=f"unix://{gone}", version="1.41")
    request = BuildRequest(
        arches=(Arch.AMD64,),
        format=ArtifactFormat.PORTABLE,
        out_dir=tmp_path / "dist",
        roots=RootfsStore(tmp_path / "cache", "http://deb.debian.org/debian"),
        containers=ContainerPolicy.from_cascade(),
    )
    with pytest.raises(BuildError) as caught:
        build([Engine("gone", client)], request, NullReporter())
    assert "the Docker engine stopped answering" in caught.value.message
    assert "docker info" in (caught.value.remedy or "")
