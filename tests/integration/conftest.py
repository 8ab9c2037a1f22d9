"""Integration helpers: containers from the shared images, the host sites MCP servers use,
and a real `inspect eval` in a child process (the engine and images: tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_tools.platforms import Arch


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


# Offline-buildable targets: Debian releases from debootstrap, and a libc-free busybox.
DEBIAN_SUITES = {"debian-11": "bullseye", "debian-12": "bookworm", "debian-13": "trixie"}


def ensure_target_image(client: Any, target: str, arch: Arch) -> str:
    from sandbox_tools.sandboxes.images import RootfsRecipe, ensure_busybox_image, ensure_image

    if target == "busybox":
        return ensure_busybox_image(client, arch)
    return ensure_image(client, RootfsRecipe(suite=DEBIAN_SUITES[target], arch=arch))


def arches_under_test() -> list[Arch]:
    """The host's architecture; arm64 too with SANDBOX_TOOLS_TEST_ARM64=1 (QEMU, slow)."""
    arches = [Arch.parse(os.uname().machine)]
    if os.environ.get("SANDBOX_TOOLS_TEST_ARM64") == "1" and Arch.ARM64 not in arches:
        arches.append(Arch.ARM64)
    return arches


MCP_SITE_MOUNT = "/opt/mcp-site"
MCP_SERVERS_MOUNT = "/opt/mcp-servers"


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


def run_inspect_eval(
    task_file: Any, *options: str, env: dict[str, str], timeout: float = 900
) -> tuple[dict[str, Any], Any]:
    """A real `inspect eval` of `task_file` in a child process (JSON log, plain display),
    run from the task's directory (inspect globs task paths relative to it). Returns the
    one sample, asserted to have run without error, and its log file."""
    import json
    import subprocess
    import sys

    logs = task_file.parent / "logs"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "inspect_ai",
            "eval",
            task_file.name,
            *options,
            "--log-format",
            "json",
            "--display",
            "plain",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "INSPECT_LOG_DIR": str(logs), **env},
        cwd=task_file.parent,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = logs.glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success", log.get("error")
    (sample,) = log["samples"]
    assert sample.get("error") is None, sample["error"]
    return sample, log_file
