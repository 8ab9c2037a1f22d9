"""Running the matrix: every artifact x distribution x scenario, dealt across engines.

What one cell does is in `cells.py`; how an engine kind gets a row's image and sandboxes
is its backend (`docker_backend.py`, `modal_backend.py`); the report and its JUnit
form are beside the record (`sandbox_tools.validation`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import docker.errors

from sandbox_tools.artifacts import Artifact, ArtifactKind
from sandbox_tools.distro_matrix.cells import Backend, BrowserCell, run_cell
from sandbox_tools.distro_matrix.docker_backend import DockerBackend
from sandbox_tools.distro_matrix.matrix import Distro, Matrix, Scenario
from sandbox_tools.distro_matrix.modal_backend import ModalBackend
from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.containers import ContainerPolicy
from sandbox_tools.sandboxes.engines import Engine, EngineKind
from sandbox_tools.sandboxes.images import RootfsStore, static_busybox
from sandbox_tools.validation import CellResult, CellStatus


def backend_for(engine: Engine, containers: ContainerPolicy, roots: RootfsStore) -> Backend:
    """The backend of an available engine (an unavailable one fails its rows unprepared)."""
    if engine.kind is EngineKind.MODAL:
        return ModalBackend()
    assert engine.client is not None  # available Docker engines have a client
    return DockerBackend(engine.client, containers, roots)


@dataclass(frozen=True)
class Row:
    """One artifact on one distribution, with the scenarios it runs: a runtime's are the
    matrix's tool scenarios, an add-on's its browser scenarios (run by `runtime`)."""

    artifact: Artifact
    distro: Distro
    scenarios: tuple[Scenario, ...]
    runtime: Artifact | None = None  # an add-on's: the runtime of its architecture


def plan(artifacts: Sequence[Artifact], addons: Sequence[Artifact], matrix: Matrix) -> list[Row]:
    """The rows a run has: each runtime on each distribution, then each browser add-on
    with the runtime of its architecture (when there is none in the run, its cells fail
    saying so). The desktop add-on has its static checks only, until the runtime serves
    its tool."""
    tools = tuple(s for s in matrix.scenarios if not s.browser)
    browser = tuple(s for s in matrix.scenarios if s.browser)
    rows = [Row(a, d, tools) for a in artifacts for d in matrix.distros if tools]
    for addon in (a for a in addons if a.kind is ArtifactKind.BROWSER):
        runtime = next((a for a in artifacts if a.arch is addon.arch), None)
        rows += [Row(addon, d, browser, runtime) for d in matrix.distros if browser]
    return rows


async def run_matrix(
    engines: Sequence[Engine],
    artifacts: list[Artifact],
    matrix: Matrix,
    jobs: int,
    on_result: Callable[[CellResult], None],
    *,
    containers: ContainerPolicy,
    roots: RootfsStore,
    addons: Sequence[Artifact] = (),
) -> list[CellResult]:
    """Every cell of `plan`, with the rows dealt round-robin to `engines`.

    Each engine runs up to `jobs` cells at once and prepares its own images. A row whose
    engine is unreachable or cannot prepare the image fails cell by cell with the reason.
    A browser cell serves its page with Debian's static busybox of its architecture
    (from `roots`, built offline like the matrix's busybox row).
    """
    backends = {e.label: backend_for(e, containers, roots) for e in engines if e.available}
    servers: dict[Arch, asyncio.Task[bytes]] = {}

    def page_server(arch: Arch) -> Awaitable[bytes]:
        if arch not in servers:
            servers[arch] = asyncio.ensure_future(asyncio.to_thread(static_busybox, arch, roots))
        return asyncio.shield(servers[arch])

    semaphores = {e.label: asyncio.Semaphore(jobs) for e in engines}
    results: list[CellResult] = []

    def report(result: CellResult) -> None:
        results.append(result)
        on_result(result)

    async def row(engine: Engine, planned: Row) -> None:
        artifact, distro, scenarios = planned.artifact, planned.distro, planned.scenarios

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
            for scenario in scenarios:
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
                prepared = await backends[engine.label].prepare(artifact, distro)
        except (SandboxToolsError, docker.errors.DockerException, OSError) as exc:
            for scenario in scenarios:
                report(
                    cell_result(
                        scenario, CellStatus.FAILED, f"engine {engine.label}: no image: {exc}"
                    )
                )
            return
        browser: BrowserCell | None = None
        if artifact.kind is not ArtifactKind.RUNTIME:
            why = None
            if planned.runtime is None:
                why = (
                    f"no runtime for {artifact.platform} in this run: an add-on is run by "
                    "the runtime of its architecture (build and validate both)"
                )
            else:
                try:
                    browser = BrowserCell(planned.runtime, await page_server(artifact.arch))
                except (SandboxToolsError, OSError) as exc:
                    why = f"no static busybox to serve the page: {exc}"
            if why is not None:
                for scenario in scenarios:
                    report(cell_result(scenario, CellStatus.FAILED, why))
                return

        async def cell(scenario: Scenario) -> None:
            reason = prepared.skip(scenario)
            if reason is not None:
                report(cell_result(scenario, CellStatus.SKIPPED, reason))
                return
            async with semaphores[engine.label]:
                opened = prepared.sandbox(scenario)
                outcome = await run_cell(
                    opened, artifact, distro, scenario, prepared.source, browser
                )
            outcome.engine = engine.label
            report(outcome)

        await asyncio.gather(*(cell(scenario) for scenario in scenarios))

    rows = plan(artifacts, addons, matrix)
    await asyncio.gather(*(row(engines[i % len(engines)], r) for i, r in enumerate(rows)))
    return sorted(results, key=lambda r: (r.platform, r.distro, r.scenario))
