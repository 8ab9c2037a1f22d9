"""Running the matrix: artifact x distribution x scenario, through the real injector."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import docker.errors
from docker import DockerClient

from sandbox_tools.artifacts import Artifact
from sandbox_tools.distro_matrix.matrix import (
    Distro,
    Matrix,
    OfflineKind,
    Scenario,
    load_matrix,
    shell_less_skip,
)
from sandbox_tools.errors import ConfigurationError, SandboxInjectionError, SandboxToolsError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, exec_remote
from sandbox_tools.injector.inject import open_tool_support
from sandbox_tools.injector.tool_clients import bash_session, new_bash_session, text_editor
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import ContainerPolicy, RunningContainer
from sandbox_tools.sandboxes.engines import Engine, EngineKind
from sandbox_tools.sandboxes.images import (
    RootfsRecipe,
    RootfsStore,
    ensure_busybox_image,
    ensure_image,
)
from sandbox_tools.validation import (
    CellResult,
    CellStatus,
    EngineStatus,
    ValidationReport,
)

# -- images -----------------------------------------------------------------------------


@dataclass
class EngineRun:
    """What one engine's rows share in a run: the caller's container policy and root
    store, and whether its registry answered (one refusal is enough for the run)."""

    containers: ContainerPolicy
    roots: RootfsStore
    registry_reachable: bool = True


def resolve_image(
    client: DockerClient, distro: Distro, arch: Arch, run: EngineRun
) -> tuple[str | None, str]:
    """(image, where it came from) or (None, why it is skipped)."""
    reasons = []
    if distro.registry:
        if run.registry_reachable:
            try:
                client.images.pull(distro.registry, platform=arch.platform)
                return distro.registry, f"registry {distro.registry}"
            except docker.errors.APIError as exc:
                run.registry_reachable = False
                reasons.append(f"registry unreachable ({str(exc.explanation or exc)[:80]})")
        else:
            reasons.append("registry unreachable")
    recipe = distro.offline
    if recipe is not None and recipe.kind is OfflineKind.DEBOOTSTRAP:
        image = ensure_image(client, RootfsRecipe(suite=recipe.suite, arch=arch), store=run.roots)
        return image, str(recipe)
    if recipe is not None:
        applets = recipe.kind is OfflineKind.BUSYBOX
        return ensure_busybox_image(client, arch, applets=applets, store=run.roots), str(recipe)
    reasons.append("no offline recipe")
    return None, ", ".join(reasons)


def matrix_image(
    client: DockerClient, selector: str, arch: Arch, run: EngineRun
) -> tuple[str, str, str]:
    """(image, where it came from, distribution) for one matrix row, e.g. `debian:12`."""
    chosen = load_matrix().select([selector]).distros[:1]
    if not chosen:
        raise ConfigurationError(f"unknown distribution {selector!r}")
    image, source = resolve_image(client, chosen[0], arch, run)
    if image is None:
        raise ConfigurationError(f"no image for {chosen[0].name} here: {source}")
    return image, source, chosen[0].name


# -- one cell ---------------------------------------------------------------------------


class CheckFailed(Exception):
    """A tool call in a cell answered, but not with what the check expects."""


async def _exercise(
    sandbox: Sandbox,
    artifact: Artifact,
    scenario: Scenario,
    checks: list[str],
    shell: bool = True,
) -> None:
    async with open_tool_support(sandbox, artifact=artifact) as support:
        client = support.client
        info = await client.call("runtime_info")
        if info.get("build_id") != artifact.build_id:
            raise CheckFailed(f"runtime_info build id {info.get('build_id')}")
        checks.append("version+runtime_info")
        if not shell:
            return  # the tools below run commands through /bin/sh, which is not there
        result = await exec_remote(client, "echo out; echo err >&2; exit 3", stream=False)
        if (result.returncode, result.stdout, result.stderr) != (3, "out\n", "err\n"):
            raise CheckFailed(f"exec_remote returned {result}")
        process = await exec_remote(client, "sleep 300", ExecRemoteOptions(poll_interval=1))
        await process.kill()
        if not (await process.wait()).killed:
            raise CheckFailed("exec_remote kill did not report killed")
        checks.append("exec_remote")
        session = await new_bash_session(client)
        if await bash_session(client, session, "echo $((6 * 7))\n") != "42\n":
            raise CheckFailed("bash_session round trip failed")
        checks.append("bash_session")
        path = f"{support.install_dir}/validate.txt"
        await text_editor(client, "create", path, file_text="alpha\n")
        await text_editor(client, "str_replace", path, old_str="alpha", new_str="beta")
        if not (await text_editor(client, "view", path)).endswith("     1\tbeta\n"):
            raise CheckFailed("text_editor round trip failed")
        checks.append("text_editor")


SandboxFactory = Callable[[], contextlib.AbstractAsyncContextManager[Sandbox]]


async def run_cell(
    open_sandbox: SandboxFactory,
    artifact: Artifact,
    distro: Distro,
    scenario: Scenario,
    source: str,
) -> CellResult:
    """One cell, whatever the backend: `open_sandbox` gives a fresh sandbox of the row's
    image with the scenario's options and removes it afterwards."""
    result = CellResult(
        artifact.name,
        artifact.platform,
        distro.name,
        scenario.name,
        CellStatus.FAILED,
        source=source,
    )
    started = time.monotonic()
    try:
        async with open_sandbox() as sandbox:
            try:
                await _exercise(sandbox, artifact, scenario, result.checks, distro.shell)
                failure: BaseException | None = None
            except SandboxInjectionError as exc:
                failure = exc
            if scenario.expect_failure:
                if isinstance(failure, SandboxInjectionError) and "tried" in str(failure):
                    result.status = CellStatus.PASSED
                    result.detail = f"failed as expected: {failure}"
                else:
                    result.detail = "expected a SandboxInjectionError naming the directories"
            elif failure is not None:
                raise failure
            else:
                result.status = CellStatus.PASSED
    except (
        SandboxToolsError,
        CheckFailed,
        docker.errors.DockerException,
        OSError,
        TimeoutError,
    ) as exc:
        result.detail = str(exc)[:2000]
    result.seconds = time.monotonic() - started
    return result


def docker_cell_sandbox(
    client: DockerClient,
    image: str,
    artifact: Artifact,
    distro: Distro,
    scenario: Scenario,
    containers: ContainerPolicy,
) -> SandboxFactory:
    """A Docker container of `image` with the scenario's options, removed afterwards."""
    options: dict[str, Any] = {"platform": artifact.platform, "read_only": scenario.read_only}
    if scenario.tmpfs:
        options["tmpfs"] = dict(scenario.tmpfs)
    if scenario.user:
        options["user"] = scenario.user
    if distro.command:
        options["command"] = distro.command

    @contextlib.asynccontextmanager
    async def open_sandbox() -> AsyncIterator[Sandbox]:
        with RunningContainer(client, image, policy=containers, **options) as container:
            yield container.sandbox

    return open_sandbox


def modal_skip(distro: Distro, scenario: Scenario, arch: Arch) -> str | None:
    """Why a cell cannot run in a Modal sandbox, or None if it can."""
    if arch is not Arch.AMD64:
        return "Modal sandboxes run amd64"
    if not distro.registry:
        return "Modal starts registry images; this row has only an offline recipe"
    if not distro.shell:
        return "Modal keeps the sandbox alive with a command from the image; this one has none"
    if scenario.read_only or scenario.tmpfs or scenario.user or scenario.expect_failure:
        return "read-only roots, tmpfs mounts and container users are Docker options"
    return None


def modal_cell_sandbox(distro: Distro) -> SandboxFactory:
    """A fresh Modal sandbox of the row's registry image, terminated afterwards."""

    @contextlib.asynccontextmanager
    async def open_sandbox() -> AsyncIterator[Sandbox]:
        from sandbox_tools.sandboxes.modal import ModalSandbox
        from sandbox_tools.sandboxes.modal_config import ModalConfig

        assert distro.registry is not None
        sandbox = await ModalSandbox.create(ModalConfig(image=distro.registry, timeout=900))
        try:
            yield sandbox
        finally:
            await sandbox.cleanup()

    return open_sandbox


# -- backends: how a row gets its sandboxes, one entry per engine kind -----------------


@dataclass(frozen=True)
class PreparedRow:
    """A row ready to run on one backend: where its image came from, which scenarios it
    cannot run (and why), and how to open a fresh sandbox for a scenario."""

    source: str
    skip: Callable[[Scenario], str | None]
    sandbox: Callable[[Scenario], SandboxFactory]


async def _docker_row(
    engine: Engine, artifact: Artifact, distro: Distro, run: EngineRun
) -> PreparedRow:
    client = engine.client
    assert client is not None  # only available engines get here
    image, source = await asyncio.to_thread(resolve_image, client, distro, artifact.arch, run)
    if image is None:
        return PreparedRow(source, lambda _: source, lambda _: _no_sandbox())
    return PreparedRow(
        source,
        lambda scenario: shell_less_skip(distro, scenario),
        lambda scenario: docker_cell_sandbox(
            client, image, artifact, distro, scenario, run.containers
        ),
    )


async def _modal_row(
    engine: Engine, artifact: Artifact, distro: Distro, run: EngineRun
) -> PreparedRow:
    return PreparedRow(
        f"registry {distro.registry} (Modal)",
        lambda scenario: modal_skip(distro, scenario, artifact.arch),
        lambda _: modal_cell_sandbox(distro),
    )


def _no_sandbox() -> SandboxFactory:
    raise AssertionError("a skipped row opens no sandbox")


ROW_BACKENDS: dict[
    EngineKind, Callable[[Engine, Artifact, Distro, EngineRun], Awaitable[PreparedRow]]
] = {EngineKind.DOCKER: _docker_row, EngineKind.MODAL: _modal_row}


# -- the whole run ----------------------------------------------------------------------


async def run_matrix(
    engines: Sequence[Engine],
    artifacts: list[Artifact],
    matrix: Matrix,
    jobs: int,
    on_result: Callable[[CellResult], None],
    *,
    containers: ContainerPolicy,
    roots: RootfsStore,
) -> list[CellResult]:
    """Every cell, with the rows (artifact x distribution) dealt round-robin to `engines`.

    Each engine runs up to `jobs` cells at once and prepares its own images. A row whose
    engine is unreachable or cannot prepare the image fails cell by cell with the reason.
    """
    runs = {e.label: EngineRun(containers, roots) for e in engines}
    semaphores = {e.label: asyncio.Semaphore(jobs) for e in engines}
    results: list[CellResult] = []

    def report(result: CellResult) -> None:
        results.append(result)
        on_result(result)

    async def row(engine: Engine, artifact: Artifact, distro: Distro) -> None:
        def cell_result(scenario: Scenario, status: CellStatus, detail: str) -> CellResult:
            return CellResult(
                artifact.name,
                artifact.platform,
                distro.name,
                scenario.name,
                status,
                detail=detail,
                engine=engine.label,
            )

        if not engine.available:
            for scenario in matrix.scenarios:
                report(
                    cell_result(
                        scenario,
                        CellStatus.FAILED,
                        f"engine {engine.label} unreachable: {engine.error}",
                    )
                )
            return
        try:
            async with semaphores[engine.label]:
                prepared = await ROW_BACKENDS[engine.kind](
                    engine, artifact, distro, runs[engine.label]
                )
        except (SandboxToolsError, docker.errors.DockerException, OSError) as exc:
            for scenario in matrix.scenarios:
                report(
                    cell_result(
                        scenario, CellStatus.FAILED, f"engine {engine.label}: no image: {exc}"
                    )
                )
            return

        async def cell(scenario: Scenario) -> None:
            reason = prepared.skip(scenario)
            if reason is not None:
                report(cell_result(scenario, CellStatus.SKIPPED, reason))
                return
            async with semaphores[engine.label]:
                opened = prepared.sandbox(scenario)
                outcome = await run_cell(opened, artifact, distro, scenario, prepared.source)
            outcome.engine = engine.label
            report(outcome)

        await asyncio.gather(*(cell(scenario) for scenario in matrix.scenarios))

    rows = [(artifact, distro) for artifact in artifacts for distro in matrix.distros]
    await asyncio.gather(*(row(engines[i % len(engines)], *spec) for i, spec in enumerate(rows)))
    return sorted(results, key=lambda r: (r.platform, r.distro, r.scenario))


def write_reports(
    results: list[CellResult],
    json_path: Path,
    junit_path: Path,
    artifacts: list[Artifact],
    engines: Sequence[Engine] = (),
    unvalidated: Sequence[str] = (),
    interrupted: bool = False,
    static: Mapping[str, list[str]] | None = None,
) -> None:
    """`unvalidated`: what was asked for but had no passing cell; it makes the run fail.
    `static`: what each artifact's static checks found (a finding fails the run)."""
    report = ValidationReport(
        artifacts=[replace(a, path=None, provenance=None) for a in artifacts],
        results=results,
        engines=[EngineStatus(e.label, e.kind.value, e.available, e.error) for e in engines],
        unvalidated=list(unvalidated),
        interrupted=interrupted,
        static={name: list(found) for name, found in (static or {}).items()},
    )
    report.dump(json_path)
    summary = report.summary
    static_failures = sum(bool(found) for found in report.static.values())
    suite = ElementTree.Element(
        "testsuite",
        name="sandbox-tools validate",
        tests=str(len(results) + len(report.static)),
        failures=str(summary["failed"] + static_failures),
        skipped=str(summary["skipped"]),
    )
    for name, found in report.static.items():
        case = ElementTree.SubElement(
            suite, "testcase", classname=name, name="static checks", time="0.00"
        )
        if found:
            text = "; ".join(found)
            ElementTree.SubElement(case, "failure", message=text[:200]).text = text
    for result in results:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=result.artifact,
            name=result.cell_id,
            time=f"{result.seconds:.2f}",
        )
        if result.status is CellStatus.FAILED:
            ElementTree.SubElement(
                case, "failure", message=result.detail[:200]
            ).text = result.detail
        elif result.status is CellStatus.SKIPPED:
            ElementTree.SubElement(case, "skipped", message=result.detail)
    junit_path.parent.mkdir(parents=True, exist_ok=True)
    ElementTree.ElementTree(suite).write(junit_path, encoding="utf-8", xml_declaration=True)
