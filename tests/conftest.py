"""Shared fixtures: a private runtime server directory per test, the real runtime server
in the test's own process, and the Docker engine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.errors import EngineUnavailableError
from sandbox_tools.platforms import Arch
from tests.support import InProcessRuntime, RuntimeDir, serve_runtime_in_process


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


@pytest.fixture
async def runtime_in_process() -> AsyncIterator[InProcessRuntime]:
    """The real runtime server on this test's event loop, with the default limits, and a
    persistent-channel client of it (`serve_runtime_in_process`; other limits: call it)."""
    async with serve_runtime_in_process() as runtime:
        yield runtime


@pytest.fixture(autouse=True)
def _no_addon_wanted_across_tests() -> Iterator[None]:
    """A test that makes the browser or desktop tools without running an evaluation would
    leave the docker_sdk sandbox checking for the add-on at every later task's start."""
    yield
    tools = sys.modules.get("sandbox_tools.inspect.tools")  # only where a test loaded it
    if tools is not None:
        tools._ADDONS_WANTED.clear()


BUILD_WAIT_TIMEOUT = 1800  # seconds, setup included (pyproject's default is 300)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that reaches a Docker engine carries the `docker` marker, whether or not
    its module says so: `-m "not docker"` then runs exactly the engine-free tests.

    In parallel runs (`-n N --dist loadscope`, as scripts/test.sh runs), a module is one
    unit of work, so its module-scoped containers are made once; modules that share a
    host-wide resource hold `this_host_as_sandbox`. Modules marked `long` start first, so
    that no worker is left alone with one at the end.

    A test that needs a built artifact may first wait for another worker to build it
    (the arm64 runtime and add-on under QEMU take minutes on a cold machine): it gets
    BUILD_WAIT_TIMEOUT unless it sets a timeout of its own."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "docker_engine" in fixtures:
            item.add_marker(pytest.mark.docker)
        needs_a_build = {"built_artifacts", "built_browser"} & set(fixtures)
        if needs_a_build and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(BUILD_WAIT_TIMEOUT))
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="module")
def this_host_as_sandbox() -> Iterator[None]:
    """Held by a module that uses this machine as the sandbox of an inspect evaluation:
    such runs share one install directory and runtime server per build (ours, and
    inspect's own tools directory, which some of them empty), so two modules of a
    parallel run take turns. A lock on the host, not on the run: any two runs at once
    would meet there too."""
    with open("/tmp/sandbox-tools-tests-local-sandbox.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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
    from sandbox_tools.recipes import RootfsRecipe
    from sandbox_tools.sandboxes.images import ensure_image

    recipe = RootfsRecipe(
        suite="bookworm", arch=Arch.parse(os.uname().machine), include=("python3",)
    )
    return ensure_image(docker_engine, recipe)


def _build(client: Any, out: Any, arch: Arch, fmt: Any) -> Any:
    from sandbox_tools.build_containers.build import BuildRequest, build
    from sandbox_tools.cli.build_cmd import PlainReporter
    from sandbox_tools.sandboxes.containers import ContainerPolicy
    from sandbox_tools.sandboxes.engines import Engine
    from sandbox_tools.sandboxes.images import RootfsStore

    request = BuildRequest(
        arches=(arch,),
        format=fmt,
        out_dir=out,
        roots=RootfsStore.from_cascade(),
        containers=ContainerPolicy.from_cascade(),
    )
    (record,) = build([Engine("default", client)], request, PlainReporter(verbose=False))
    return record, out / record.name


@contextlib.contextmanager
def _shared_by_the_run(factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A directory every worker of this run shares (pytest-xdist gives each worker its own
    base directory under one parent), held under an exclusive lock: the first worker to
    need an artifact builds it there, the others wait and reuse it."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    shared = root / name
    shared.mkdir(exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield shared


@pytest.fixture(scope="session")
def built_artifacts(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Artifacts built for real by `tools build` code, one build per (arch, format) in
    the whole run (each worker of a parallel run reuses the first one's)."""

    from sandbox_tools.artifacts import ArtifactFormat

    cache: dict[tuple[Arch, Any], Any] = {}

    def get(arch: Arch, fmt: Any = ArtifactFormat.PORTABLE) -> Any:
        if (arch, fmt) not in cache:
            with _shared_by_the_run(tmp_path_factory, "dist") as out:
                cache[arch, fmt] = _build(docker_engine, out, arch, fmt)
        return cache[arch, fmt]

    return get


@pytest.fixture(scope="session")
def built_addon(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`built_addon(kind, arch)`: an add-on built for real by `tools build` code, once per
    kind and architecture; a later session copies it from the cache by build id (about a
    second)."""

    from sandbox_tools.artifacts import ArtifactKind
    from sandbox_tools.build_containers.build import build_addon_once
    from sandbox_tools.sandboxes.containers import ContainerPolicy
    from sandbox_tools.sandboxes.images import RootfsStore

    cache: dict[tuple[ArtifactKind, Arch], Any] = {}
    roots, containers = RootfsStore.from_cascade(), ContainerPolicy.from_cascade()

    def get(kind: ArtifactKind, arch: Arch) -> Any:
        if (kind, arch) not in cache:
            with _shared_by_the_run(tmp_path_factory, f"dist-{kind.value}") as out:
                record = build_addon_once(
                    docker_engine, kind, arch, out, lambda _: None, roots, containers
                )
            cache[kind, arch] = record, out / record.name
        return cache[kind, arch]

    return get


@pytest.fixture(scope="session")
def built_browser(built_addon: Any) -> Any:
    """The browser add-on of an architecture (`built_addon`)."""
    from sandbox_tools.artifacts import ArtifactKind

    return lambda arch: built_addon(ArtifactKind.BROWSER, arch)


@pytest.fixture(scope="session")
def browser_dist(
    built_artifacts: Any, built_browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One directory holding this host's runtime, its browser add-on and both build
    records: what the `Dist` source of acquisition (injector/acquire.py) reads, so a
    test's SANDBOX_TOOLS_DIST finds both builds of this session."""
    from sandbox_tools.artifacts import write_build_records

    arch = Arch.parse(os.uname().machine)
    runtime, runtime_path = built_artifacts(arch)
    browser, browser_path = built_browser(arch)
    dist = tmp_path_factory.mktemp("runtime-and-browser-dist")
    for path in (runtime_path, browser_path):
        (dist / path.name).symlink_to(path)
    write_build_records(dist, [runtime, browser])
    return dist
