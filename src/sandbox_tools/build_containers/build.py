"""tools build: turn the runtime into one self-contained executable per architecture.

Stages per architecture: base image (debootstrap root), builder image (imported into
the engine), dependencies (host-side wheelhouse), freeze (PyInstaller in a container
of that architecture), package (the single-file artifact) and smoke test (the fresh
artifact answers `version` and `runtime_info` in a container of its architecture).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import requests
from docker import DockerClient

from sandbox_tools._version import __version__
from sandbox_tools.artifacts import (
    Artifact,
    ArtifactFormat,
    ArtifactKind,
    TextEnum,
    addon_artifact_name,
    artifact_name,
    atomic_output,
    atomic_write,
    read_build_records,
    sha256_of,
    write_build_records,
)
from sandbox_tools.build_containers.addon import build_addon, built_addon_cache, reusable_addon
from sandbox_tools.build_containers.builder import builder_image_tag, check_builder_root
from sandbox_tools.build_containers.lock import (
    FREEZE_LOCK,
    FREEZE_PINS,
    PYTHON_VERSION,
    RESOURCES,
    STATICX_LOCK,
    STATICX_PINS,
    ensure_wheelhouse,
)
from sandbox_tools.build_containers.package import pack_portable
from sandbox_tools.build_containers.records import (
    addon_build_id,
    builder_recipe,
    compute_build_id,
    tree_id,
)
from sandbox_tools.cache import one_builder
from sandbox_tools.errors import BuildError, SandboxToolsError
from sandbox_tools.platforms import Arch
from sandbox_tools.protocol import JSONRPC_VERSION
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.containers import (
    ContainerPolicy,
    RunningContainer,
    run_to_completion,
)
from sandbox_tools.sandboxes.engines import Engine, EngineKind
from sandbox_tools.sandboxes.images import (
    RootfsStore,
    build_rootfs,
    image_exists,
    import_rootfs,
)


class Stage(TextEnum):
    """A build's stages, in the order they run."""

    BASE_IMAGE = "base image"
    BUILDER_IMAGE = "builder image"
    DEPENDENCIES = "dependencies"
    FREEZE = "freeze"
    PACKAGE = "package"
    SMOKE_TEST = "smoke test"
    ADDON = "add-ons"  # only with --with-browser or --with-desktop: build_containers/addon.py

    @property
    def number(self) -> int:
        """How many stages come before this one."""
        return list(Stage).index(self)


SMOKE_DIR = "/opt/sandbox-tools-smoke"


class BuildReporter(Protocol):
    def stage(self, arch: Arch, stage: Stage) -> None: ...

    def log(self, arch: Arch, line: str) -> None: ...

    def finished(self, arch: Arch, record: Artifact, skipped: bool) -> None: ...


class NullReporter:
    """For builds nobody watches (the injector building on demand)."""

    def stage(self, arch: Arch, stage: Stage) -> None: ...

    def log(self, arch: Arch, line: str) -> None: ...

    def finished(self, arch: Arch, record: Artifact, skipped: bool) -> None: ...


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    arches: tuple[Arch, ...]
    format: ArtifactFormat
    out_dir: Path
    roots: RootfsStore  # the Debian mirror and the cache, from the caller's settings
    containers: ContainerPolicy  # keep/echo, and the tracker Ctrl-C empties
    addons: tuple[ArtifactKind, ...] = ()  # also these optional add-ons of each architecture


def _reusable(out_dir: Path, name: str, build_id: str, fmt: ArtifactFormat) -> Artifact | None:
    for record in read_build_records(out_dir):
        if record.name == name and record.build_id == build_id and record.format is fmt:
            return record if record.matches(out_dir / name) else None
    return None


def _freeze(
    client: DockerClient,
    arch: Arch,
    fmt: ArtifactFormat,
    image: str,
    build_id: str,
    work: Path,
    wheelhouses: dict[str, Path],
    reporter: BuildReporter,
    containers: ContainerPolicy,
) -> None:
    source_root = Path(__file__).resolve().parent.parent.parent  # contains sandbox_tools/
    (work / "_build_info.json").write_text(json.dumps({"build_id": build_id, "format": fmt.value}))
    tail: list[str] = []

    def on_line(line: str) -> None:
        tail.append(line)
        del tail[:-40]
        if line.strip():
            reporter.log(arch, line)

    code, _ = run_to_completion(
        client,
        image,
        ["sh", "/recipe/freeze.sh"],
        on_line=on_line,
        platform=arch.platform,
        environment={"FORMAT": fmt.value},
        # Copied in and out rather than bind-mounted: the engine may be another machine's.
        copy_in={
            "/src/sandbox_tools": source_root / "sandbox_tools",
            **wheelhouses,
            "/recipe": RESOURCES,
            "/out": work,
        },
        copy_out=("/out", work),
        policy=containers,
    )
    if code != 0:
        raise BuildError(f"freezing for {arch.value} failed (exit {code}):\n" + "\n".join(tail))


def _smoke_test(
    client: DockerClient,
    image: str,
    arch: Arch,
    artifact: Path,
    build_id: str,
    containers: ContainerPolicy,
) -> None:
    """The fresh artifact must answer in a container of its architecture, unpacked there:
    one `exec` per request, as a host without a persistent channel calls it (the build
    speaks the wire protocol itself; it sits below the injector)."""

    exe = f"{SMOKE_DIR}/{artifact.name}"
    with RunningContainer(client, image, policy=containers, platform=arch.platform) as container:
        sandbox = container.sandbox

        async def call(request_id: int, method: str) -> Any:
            request = json.dumps({"jsonrpc": JSONRPC_VERSION, "id": request_id, "method": method})
            try:
                out = await sandbox.exec([exe, "exec", request], timeout=300)
            except (SandboxToolsError, TimeoutError) as exc:
                why = exc.message if isinstance(exc, SandboxToolsError) else str(exc)
                raise BuildError(f"smoke test: {exe} did not answer {method}: {why}") from None
            try:
                return json.loads(out.stdout)["result"]
            except (ValueError, KeyError, TypeError):
                raise BuildError(
                    f"smoke test: {exe} answered {method} with {out.stdout[:300]!r} "
                    f"(exit {out.returncode}): {out.stderr.decode(errors='replace')[-300:]}"
                ) from None

        async def check() -> tuple[Any, Any]:
            await sandbox.exec(["mkdir", "-p", SMOKE_DIR])
            await sandbox.write_file(exe, artifact.read_bytes(), mode=0o755)
            return await call(1, "version"), await call(2, "runtime_info")

        version, info = asyncio.run(check())
    if version != __version__ or not isinstance(info, dict) or info.get("build_id") != build_id:
        raise BuildError(
            f"smoke test of {artifact.name}: expected version {__version__} and build id "
            f"{build_id}, got {version!r} and {info!r}"
        )


def _pinned_versions(fmt: ArtifactFormat) -> dict[str, str]:
    """Tool versions as the locks pin them (one source of truth)."""
    pins = FREEZE_PINS + (STATICX_PINS if fmt is ArtifactFormat.STATICX else ())
    return dict(pin.split("==", 1) for pin in pins)


# Set while an interrupted build winds down: workers stop at their next stage.
_CANCELLED = threading.Event()


class BuildCancelled(Exception):
    pass


def _stage(reporter: BuildReporter, arch: Arch, name: Stage) -> None:
    if _CANCELLED.is_set():
        raise BuildCancelled(f"{arch.value}: interrupted before {name}")
    reporter.stage(arch, name)


def built_runtime_cache(build_id: str, fmt: ArtifactFormat, roots: RootfsStore) -> Path:
    """Where a finished runtime artifact is kept by its build id (the add-on's are kept
    the same way), with its record: a build of the same inputs into another directory
    (a test run's, a rehearsal's, a second checkout's) copies it instead of freezing the
    runtime again, which takes minutes for arm64 under QEMU."""
    return roots.directory() / "runtime" / f"{build_id.removeprefix('sha256:')}-{fmt.value}"


_CACHED_RECORD = "record.json"


def copy_from_cache(cached: Path, out_dir: Path, name: str) -> Artifact | None:
    """The artifact `name` copied from `cached` into `out_dir`, or None when the cache
    holds none. A cached file that is not the bytes its record names (a disk error, a
    hand edit, a copy cut short) is removed, so the caller builds afresh."""
    try:
        record = Artifact.from_json(json.loads((cached / _CACHED_RECORD).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        shutil.rmtree(cached, ignore_errors=True)
        return None
    source = cached / name
    if record.name != name or not record.matches(source, cache=False):
        shutil.rmtree(cached, ignore_errors=True)
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_output(out_dir / name, 0o755) as handle, source.open("rb") as packed:
        shutil.copyfileobj(packed, handle, 1 << 20)
    return record


def _keep_in_cache(cached: Path, output: Path, record: Artifact) -> None:
    """`output` and its record under `cached`; the record is written last, so a cache
    entry without one (a crash between the two) is read as none."""
    cached.mkdir(parents=True, exist_ok=True)
    with atomic_output(cached / output.name, 0o755) as handle, output.open("rb") as built:
        shutil.copyfileobj(built, handle, 1 << 20)
    atomic_write(cached / _CACHED_RECORD, json.dumps(record.to_json(), indent=1))


def build_arch(
    client: DockerClient, arch: Arch, request: BuildRequest, reporter: BuildReporter
) -> Artifact:
    """The runtime for `arch` in the request's directory: reused when its record there
    has the current build id, copied from the cache when one was built for that id, else
    built (and kept in the cache)."""
    recipe = builder_recipe(arch)
    build_id = compute_build_id(arch, request.format, recipe.digest)
    name = artifact_name(arch, request.format)
    existing = _reusable(request.out_dir, name, build_id, request.format)
    if existing is not None:
        reporter.finished(arch, existing, skipped=True)
        return existing
    cached = built_runtime_cache(build_id, request.format, request.roots)
    with one_builder(cached):
        copied = copy_from_cache(cached, request.out_dir, name)
        if copied is not None:
            reporter.log(arch, f"build id unchanged: copied from {cached}")
            reporter.finished(arch, copied, skipped=True)
            return copied
        record = _build_runtime(client, arch, request, reporter, recipe, build_id, name)
        _keep_in_cache(cached, request.out_dir / name, record)
    reporter.finished(arch, record, skipped=False)
    return record


def _build_runtime(
    client: DockerClient,
    arch: Arch,
    request: BuildRequest,
    reporter: BuildReporter,
    recipe: RootfsRecipe,
    build_id: str,
    name: str,
) -> Artifact:
    _stage(reporter, arch, Stage.BASE_IMAGE)
    image = builder_image_tag(arch)
    missing = not image_exists(client, image)
    log = lambda line: reporter.log(arch, line)  # noqa: E731
    rootfs = build_rootfs(recipe, request.roots, log) if missing else None
    _stage(reporter, arch, Stage.BUILDER_IMAGE)
    if rootfs is not None:
        check_builder_root(arch, rootfs)  # the exact packages the build id stands for
        import_rootfs(client, rootfs, image, arch)
    _stage(reporter, arch, Stage.DEPENDENCIES)
    cache = request.roots.directory()
    wheelhouses = {"/wheelhouse": ensure_wheelhouse(arch, FREEZE_LOCK, cache)}
    if request.format is ArtifactFormat.STATICX:
        wheelhouses["/wheelhouse-staticx"] = ensure_wheelhouse(arch, STATICX_LOCK, cache)

    _stage(reporter, arch, Stage.FREEZE)
    # A fresh directory per build: two builds of one architecture at once (CI jobs on one
    # runner) must not write into each other's tree.
    (cache / "build").mkdir(parents=True, exist_ok=True)
    work = Path(
        tempfile.mkdtemp(prefix=f"{arch.value}-{request.format.value}-", dir=cache / "build")
    )
    try:
        _freeze(
            client,
            arch,
            request.format,
            image,
            build_id,
            work,
            wheelhouses,
            reporter,
            request.containers,
        )

        _stage(reporter, arch, Stage.PACKAGE)
        request.out_dir.mkdir(parents=True, exist_ok=True)
        output = request.out_dir / name
        if request.format is ArtifactFormat.PORTABLE:
            metadata = {
                "build_id": build_id,
                "version": __version__,
                "platform": arch.platform,
                "format": request.format.value,
            }
            pack_portable(work / "launcher", work / "runtime", tree_id(build_id), output, metadata)
        else:
            frozen = work / "runtime.staticx"
            with atomic_output(output, 0o755) as handle, frozen.open("rb") as src:
                shutil.copyfileobj(src, handle)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    _stage(reporter, arch, Stage.SMOKE_TEST)
    try:
        _smoke_test(client, image, arch, output, build_id, request.containers)
    except BaseException:
        output.unlink(missing_ok=True)  # an artifact that failed its smoke test is not kept
        raise
    record = Artifact(
        name=name,
        arch=arch,
        format=request.format,
        size=output.stat().st_size,
        sha256=sha256_of(output),
        build_id=build_id,
        tool_versions={
            **_pinned_versions(request.format),
            "python": f"{PYTHON_VERSION} (Debian {recipe.suite})",
            "builder": image,
        },
    )
    return record


def _remove_unrecorded(request: BuildRequest, records: list[Artifact], since: float) -> None:
    """Outputs this run wrote but did not record (interrupted mid-way) are not artifacts."""
    recorded = {record.name for record in records}
    for arch in request.arches:
        names = [artifact_name(arch, request.format)]
        names += [addon_artifact_name(kind, arch) for kind in request.addons]
        for output in (request.out_dir / name for name in names):
            with contextlib.suppress(FileNotFoundError):
                if output.name not in recorded and output.stat().st_mtime >= since:
                    output.unlink()
            for partial in request.out_dir.glob(f".{output.name}*"):
                partial.unlink(missing_ok=True)


def _addon(
    client: DockerClient,
    kind: ArtifactKind,
    arch: Arch,
    request: BuildRequest,
    reporter: BuildReporter,
) -> Artifact:
    existing = reusable_addon(kind, request.out_dir, arch, addon_build_id(kind, arch))
    if existing is not None:
        reporter.finished(arch, existing, skipped=True)
        return existing
    _stage(reporter, arch, Stage.ADDON)
    record = build_addon_once(
        client,
        kind,
        arch,
        request.out_dir,
        lambda line: reporter.log(arch, line),
        request.roots,
        request.containers,
    )
    reporter.finished(arch, record, skipped=False)
    return record


def build_addon_once(
    client: DockerClient,
    kind: ArtifactKind,
    arch: Arch,
    out_dir: Path,
    log: Callable[[str], None],
    roots: RootfsStore,
    containers: ContainerPolicy,
) -> Artifact:
    """`build_addon`, one maker per build id on this host: a second build of the same
    add-on at once (a rehearsal beside a test run) waits, then copies the first one's
    from the cache instead of assembling it again (minutes per architecture)."""
    with one_builder(built_addon_cache(kind, addon_build_id(kind, arch), roots)):
        return build_addon(client, kind, arch, out_dir, log, roots, containers)


def _on_engine(
    engine: Engine, arch: Arch, request: BuildRequest, reporter: BuildReporter
) -> list[Artifact]:
    if engine.kind is EngineKind.MODAL:
        raise BuildError(
            "builds do not run on Modal: the builder image is made locally from Debian's "
            "mirror and needs a Docker engine",
            remedy="Build on Docker engines (--engine default, URLs or contexts).",
        )
    if engine.client is None:
        raise BuildError(
            f"engine {engine.label} is unreachable: {engine.error}",
            remedy="Start that engine, or build without it.",
        )
    reporter.log(arch, f"building on engine {engine.label}")
    records = [build_arch(engine.client, arch, request, reporter)]
    for kind in request.addons:
        records.append(_addon(engine.client, kind, arch, request, reporter))
    return records


def build(
    engines: Sequence[Engine],
    request: BuildRequest,
    reporter: BuildReporter,
    on_error: Callable[[Arch, BaseException], None] | None = None,
) -> list[Artifact]:
    """Build every requested architecture in parallel; records go to dist/build.json.

    Each architecture's add-ons (`request.addons`) follow its runtime in the same worker.

    The architectures are dealt round-robin across `engines` (each builds its share, in
    parallel); `local_engine()` is this machine's.
    """
    records: list[Artifact] = []
    errors: list[tuple[Arch, BaseException]] = []
    started = time.time()
    pool = ThreadPoolExecutor(max_workers=len(request.arches))
    try:
        futures = {
            arch: pool.submit(_on_engine, engines[i % len(engines)], arch, request, reporter)
            for i, arch in enumerate(request.arches)
        }
        for arch, future in futures.items():
            try:
                records += future.result()
            except Exception as exc:  # report every architecture, then fail
                errors.append((arch, exc))
                if on_error is not None:
                    on_error(arch, exc)
    except KeyboardInterrupt:
        # Stop now, not at the end: the builder containers go (which ends the threads
        # waiting on them), and nothing half-made is left in the output directory.
        _CANCELLED.set()
        request.containers.tracker.remove_all()
        pool.shutdown(wait=True, cancel_futures=True)
        _CANCELLED.clear()
        _remove_unrecorded(request, records, started)
        if records:
            write_build_records(request.out_dir, records)
        raise
    pool.shutdown(wait=True)
    if records:
        write_build_records(request.out_dir, records)
    if errors:
        arch, first = errors[0]
        if isinstance(first, BuildError):
            raise first
        if isinstance(first, requests.exceptions.ConnectionError):
            raise BuildError(
                f"building {arch.value} failed: the Docker engine stopped answering ({first})",
                remedy="Check that the engine runs (`docker info`; its log, e.g. "
                "journalctl -u docker or /var/log/sandbox-tools-dockerd.log), then build "
                "again: what was built is kept.",
            ) from first
        raise BuildError(f"building {arch.value} failed: {first!r}") from first
    return records
