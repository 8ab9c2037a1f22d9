"""Docker fixtures: a real engine, and an offline-built Debian image with python3."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_tools.errors import EngineUnavailableError
from sandbox_tools.platforms import Arch


def _engine_or_skip() -> Any:
    from sandbox_tools.sandboxes.docker import docker_client

    try:
        return docker_client()
    except EngineUnavailableError as exc:
        if os.environ.get("SANDBOX_TOOLS_REQUIRE_DOCKER") == "1":
            pytest.fail(f"SANDBOX_TOOLS_REQUIRE_DOCKER=1 but {exc}")
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(scope="session")
def docker_engine() -> Any:
    return _engine_or_skip()


@pytest.fixture(scope="session")
def python_image(docker_engine: Any) -> str:
    """Debian bookworm (minbase + python3) for the host's architecture, built offline."""
    from sandbox_tools.sandboxes.images import RootfsRecipe, ensure_image

    recipe = RootfsRecipe(
        suite="bookworm", arch=Arch.parse(os.uname().machine), include=("python3",)
    )
    return ensure_image(docker_engine, recipe)


@pytest.fixture
def python_container(docker_engine: Any, python_image: str) -> Iterator[Any]:
    from sandbox_tools.injector.source_runtime import SOURCE_MOUNT, package_parent
    from sandbox_tools.sandboxes.docker import running_container

    with running_container(
        docker_engine,
        python_image,
        volumes={str(package_parent()): {"bind": SOURCE_MOUNT, "mode": "ro"}},
    ) as container:
        yield container
