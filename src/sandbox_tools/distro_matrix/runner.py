"""Running the matrix: every artifact x distribution x scenario, dealt across engines.

What one cell does is in `cells.py`; how an engine kind gets a row's image and sandboxes
is its backend (`docker_backend.py`, `modal_backend.py`); the report and its JUnit
form are beside the record (`sandbox_tools.validation`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import docker.errors

from sandbox_tools.artifacts import Artifact
from sandbox_tools.distro_matrix.cells import Backend, run_cell
from sandbox_tools.distro_matrix.docker_backend import DockerBackend
from sandbox_tools.distro_matrix.matrix import Distro, Matrix, Scenario
from sandbox_tools.distro_matrix.modal_backend import ModalBackend
from sandbox_tools.errors import SandboxToolsError
from sandbox_tools.sandboxes.containers import ContainerPolicy
from sandbox_tools.sandboxes.engines import Engine, EngineKind
from sandbox_tools.sandboxes.images import RootfsStore
from sandbox_tools.validation import CellResult, CellStatus


def backend_for(engine: Engine, containers: ContainerPolicy, roots: RootfsStore) -> Backend:
    """The backend of an available engine (an unavailable one fails its rows unprepared)."""
    if engine.kind is EngineKind.MODAL:
        return ModalBackend()
    assert engine.client is not None  # available Docker engines have a client
    return DockerBackend(engine.client, containers, roots)


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
    backends = {e.label: backend_for(e, containers, roots) for e in engines if e.available}
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
                prepared = await backends[engine.label].prepare(artifact, distro)
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
