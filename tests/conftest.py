"""Shared fixtures: a private runtime server directory per test, and the Docker engine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.errors import EngineUnavailableError
from sandbox_tools.platforms import Arch

SRC = str(Path(__file__).resolve().parent.parent / "src")


def peak_rss_mib(pid: int | str = "self") -> float:
    """Peak resident memory (VmHWM) of a process, MiB: what bounds on memory are checked by."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


@dataclass
class RuntimeDir:
    """A private server directory and helpers to drive the runtime CLI from source."""

    path: str

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SANDBOX_TOOLS_DIR": self.path,
            "PYTHONPATH": SRC,
            "SANDBOX_TOOLS_KILL_GRACE": "0.5",
        }

    def cli(
        self, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandbox_tools.runtime", *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        done = self.cli("exec", json.dumps(request))
        assert done.returncode == 0, done.stderr
        response: dict[str, Any] = json.loads(done.stdout)
        return response

    def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        response = self.call(method, params)
        assert "result" in response, response
        return response["result"]

    def server_pid(self) -> int | None:
        try:
            return int(Path(self.path, "server.pid").read_text())
        except (OSError, ValueError):
            return None

    def server_starts(self) -> int:
        log = Path(self.path, "server.log")
        return log.read_text().count("server started") if log.exists() else 0


@pytest.fixture
def runtime_dir() -> Iterator[RuntimeDir]:
    # Short path on purpose: Unix socket paths are limited to 107 bytes.
    directory = RuntimeDir(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    yield directory
    pid = directory.server_pid()
    directory.cli("stop-server", timeout=30)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(directory.path, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that reaches a Docker engine carries the `docker` marker, whether or not
    its module says so: `-m "not docker"` then runs exactly the engine-free tests."""
    for item in items:
        if "docker_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


def eventually(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Wait until `check()` holds, polling; fail naming `what` after `timeout` seconds.

    Tests wait for conditions, never for a fixed time: a fixed sleep is too short on a
    loaded machine and wasted on an idle one.
    """
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)


# -- the Docker engine, an offline-built image and real artifacts (every test folder) --


def _engine_or_skip() -> Any:
    from sandbox_tools.sandboxes.engines import docker_client

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


def _build(client: Any, out: Any, arch: Arch, fmt: Any) -> Any:
    from sandbox_tools.build_containers.build import BuildRequest, build
    from sandbox_tools.cli.build_cmd import PlainReporter
    from sandbox_tools.sandboxes.engines import Engine

    request = BuildRequest(arches=(arch,), format=fmt, out_dir=out)
    (record,) = build([Engine("default", client)], request, PlainReporter(verbose=False))
    return record, out / record.name


@pytest.fixture(scope="session")
def built_artifacts(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Artifacts built for real by `tools build` code, one build per (arch, format)."""
    from pathlib import Path

    from sandbox_tools.artifacts import ArtifactFormat

    out = Path(tmp_path_factory.mktemp("dist"))
    cache: dict[tuple[Arch, Any], Any] = {}

    def get(arch: Arch, fmt: Any = ArtifactFormat.PORTABLE) -> Any:
        if (arch, fmt) not in cache:
            cache[arch, fmt] = _build(docker_engine, out, arch, fmt)
        return cache[arch, fmt]

    return get


@pytest.fixture(scope="session")
def built_browser(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The browser add-on built for real by `tools build` code, once per architecture;
    a later session copies it from the cache by build id (about a second)."""
    from pathlib import Path

    from sandbox_tools.build_containers.browser import build_browser

    out = Path(tmp_path_factory.mktemp("dist-browser"))
    cache: dict[Arch, Any] = {}

    def get(arch: Arch) -> Any:
        if arch not in cache:
            record = build_browser(docker_engine, arch, out, lambda _: None)
            cache[arch] = record, out / record.name
        return cache[arch]

    return get
