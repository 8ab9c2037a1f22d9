"""Integration helpers: containers from the shared images, the host sites MCP servers use,
and a real `inspect eval` in a child process (the engine and images: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import (
    MCP_SERVERS_MOUNT,
    MCP_SITE_MOUNT,
    NONROOT,
    arches_under_test,
    ensure_target_image,
)


@pytest.fixture
def python_container(docker_engine: Any, python_image: str) -> Iterator[Any]:
    from sandbox_tools.injector.source_runtime import SOURCE_MOUNT, package_parent
    from sandbox_tools.sandboxes.containers import RunningContainer

    with RunningContainer(
        docker_engine,
        python_image,
        volumes={str(package_parent()): {"bind": SOURCE_MOUNT, "mode": "ro"}},
    ) as container:
        yield container


@pytest.fixture
async def client(runtime_dir: Any) -> Any:
    """A persistent-channel client of a runtime server from source, on this machine."""
    from sandbox_tools.injector.jsonrpc_client import StdioRuntimeClient
    from sandbox_tools.injector.source_runtime import local_source_runtime
    from sandbox_tools.sandboxes.local import LocalSandbox

    launch = local_source_runtime(runtime_dir.path)
    runtime_client = StdioRuntimeClient(LocalSandbox(), launch.command, env=launch.env)
    yield runtime_client
    await runtime_client.aclose()


def _host_site(requirement: str) -> Any:
    """A package for containers, installed on the host (containers have no HTTPS) into a
    directory mounted read-only as PYTHONPATH: a wheelhouse, unpacked, cached by version.
    Built for the offline Debian image's Python (3.11), so only with a host Python 3.11."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    if sys.version_info[:2] != (3, 11):
        pytest.skip("the container's Python is 3.11; the host's must match to share wheels")
    constraints = Path(__file__).parents[2] / "constraints-dev.txt"
    name, version = requirement.split("==")
    cache = Path.home() / ".cache" / "sandbox-tools" / f"{name}-site-{version}"
    if not cache.is_dir():
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{name}-site-"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(staging),
                "-c",
                str(constraints),
                requirement,
            ],
            check=True,
        )
        staging.chmod(0o755)  # mkdtemp made it private: other uids in containers read it
        try:
            staging.rename(cache)
        except OSError:  # another session won the race
            shutil.rmtree(staging, ignore_errors=True)
    return cache


@pytest.fixture(scope="session")
def mcp_site() -> Any:
    """The `mcp` package (the version pinned for development) for containers."""
    from pathlib import Path

    constraints = Path(__file__).parents[2] / "constraints-dev.txt"
    pin = next(line for line in constraints.read_text().splitlines() if line.startswith("mcp=="))
    return _host_site(pin)


# The official OpenAI SDK inside the sandbox, for the model-proxy tests only.
OPENAI_FOR_CONTAINERS = "openai==3.54.0"


@pytest.fixture(scope="session")
def openai_site() -> Any:
    return _host_site(OPENAI_FOR_CONTAINERS)


@pytest.fixture
def mcp_volumes(mcp_site: Any) -> dict[str, dict[str, str]]:
    from pathlib import Path

    servers = Path(__file__).parents[1] / "mcp_servers"
    return {
        str(mcp_site): {"bind": MCP_SITE_MOUNT, "mode": "ro"},
        str(servers): {"bind": MCP_SERVERS_MOUNT, "mode": "ro"},
    }


@pytest.fixture(scope="session")
def self_check_image(docker_engine: Any) -> str:
    """Debian bookworm with what inspect's checks call: `adduser` and `ps` (procps), and
    a user `nonroot` with a home directory. Built offline from debootstrap."""
    import io
    import os

    from sandbox_tools.platforms import Arch
    from sandbox_tools.recipes import RootfsRecipe
    from sandbox_tools.sandboxes.images import ensure_image

    recipe = RootfsRecipe(
        suite="bookworm",
        arch=Arch.parse(os.uname().machine),
        include=("python3", "adduser", "procps"),
    )
    base = ensure_image(docker_engine, recipe)
    tag = f"{base}-selfcheck"
    try:
        docker_engine.images.get(tag)
    except Exception:
        dockerfile = f"FROM {base}\nRUN useradd --create-home --shell /bin/sh {NONROOT}\n"
        docker_engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


@pytest.fixture
def artifact(built_artifacts: Any) -> Any:
    """This run's runtime for the first architecture under test (built once for the
    whole run: a fresh clone has no dist/)."""
    from sandbox_tools.artifacts import Provenance

    record, path = built_artifacts(arches_under_test()[0])
    return record.found_at(path, Provenance.DIST)


@pytest.fixture
def debian_image(docker_engine: Any) -> str:
    return ensure_target_image(docker_engine, "debian-12", arches_under_test()[0])


@pytest.fixture(scope="session")
def planted_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """PLANTED_LIBRARY_SOURCE built here (x86_64 only: the host's compiler)."""
    import os
    import subprocess

    from tests.support import PLANTED_LIBRARY_SOURCE

    if os.uname().machine != "x86_64":
        pytest.skip("the planted library is built here, for x86_64")
    where = tmp_path_factory.mktemp("planted")
    (where / "planted.c").write_text(PLANTED_LIBRARY_SOURCE)
    out = where / "planted.so"
    build = ["gcc", "-shared", "-fPIC", "-o", str(out), str(where / "planted.c")]
    subprocess.run(build, check=True)
    return out.read_bytes()
