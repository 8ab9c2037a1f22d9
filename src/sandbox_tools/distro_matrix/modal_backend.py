"""The Modal backend of the matrix: registry rows only, amd64, one Modal sandbox per
cell; scenarios that need Docker's options (read-only root, tmpfs, a user) are skipped
with the reason."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from sandbox_tools.artifacts import Artifact
from sandbox_tools.distro_matrix.cells import PreparedRow, SandboxFactory
from sandbox_tools.distro_matrix.matrix import Distro, Scenario
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.base import Sandbox


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


class ModalBackend:
    async def prepare(self, artifact: Artifact, distro: Distro) -> PreparedRow:
        return PreparedRow(
            f"registry {distro.registry} (Modal)",
            lambda scenario: modal_skip(distro, scenario, artifact.arch),
            lambda _: modal_cell_sandbox(distro),
        )
