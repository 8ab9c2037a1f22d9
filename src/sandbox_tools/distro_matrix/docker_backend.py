"""The Docker backend of the matrix: a row's image (pulled from its registry where one
answers, else made offline from its recipe) and one container per cell with the
scenario's options, under the invocation's container policy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import docker.errors
from docker import DockerClient

from sandbox_tools.artifacts import Artifact
from sandbox_tools.distro_matrix.cells import PreparedRow, SandboxFactory, no_sandbox
from sandbox_tools.distro_matrix.matrix import (
    Distro,
    OfflineKind,
    Scenario,
    load_matrix,
    shell_less_skip,
)
from sandbox_tools.errors import ConfigurationError
from sandbox_tools.platforms import Arch
from sandbox_tools.protocol import BROWSER_CALL_TIMEOUT_ENV
from sandbox_tools.recipes import RootfsRecipe
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import ContainerPolicy, RunningContainer
from sandbox_tools.sandboxes.images import (
    RootfsStore,
    ensure_busybox_image,
    ensure_image,
)

EMULATED_BROWSER_CALL_S = 150  # under the host's 180 s per browser call


class DockerBackend:
    """One Docker engine's share of a run. It remembers whether the engine's registry
    answered: one refusal is enough for the run, so offline machines do not wait on
    every row."""

    def __init__(self, client: DockerClient, containers: ContainerPolicy, roots: RootfsStore):
        self.client = client
        self.containers = containers
        self.roots = roots
        self.registry_reachable = True
        self._native: Arch | None = None
        # Chromium under emulation, one cell at a time: two at once on a two-core
        # machine starved each other until a renderer crashed.
        self._emulated_browser = asyncio.Lock()

    def native_arch(self) -> Arch | None:
        """The engine's own architecture (others run under emulation), once asked."""
        if self._native is None:
            try:
                self._native = Arch.parse(str(self.client.info().get("Architecture", "")))
            except (ValueError, docker.errors.DockerException):
                return None
        return self._native

    def resolve_image(self, distro: Distro, arch: Arch) -> tuple[str | None, str]:
        """(image, where it came from) or (None, why the row is skipped)."""
        reasons = []
        reference = distro.pull_reference
        if reference is not None:
            if self.registry_reachable:
                try:
                    self.client.images.pull(reference, platform=arch.platform)
                    pinned = "" if distro.digest else " (not pinned by digest)"
                    return reference, f"registry {reference}{pinned}"
                except docker.errors.APIError as exc:
                    self.registry_reachable = False
                    reasons.append(f"registry unreachable ({str(exc.explanation or exc)[:80]})")
            else:
                reasons.append("registry unreachable")
        recipe = distro.offline
        if recipe is not None and recipe.kind is OfflineKind.DEBOOTSTRAP:
            root = RootfsRecipe(suite=recipe.suite, arch=arch)
            return ensure_image(self.client, root, store=self.roots), str(recipe)
        if recipe is not None:
            applets = recipe.kind is OfflineKind.BUSYBOX
            image = ensure_busybox_image(self.client, arch, applets=applets, store=self.roots)
            return image, str(recipe)
        reasons.append("no offline recipe")
        return None, ", ".join(reasons)

    def matrix_image(self, selector: str, arch: Arch) -> tuple[str, str, str]:
        """(image, where it came from, distribution) for one matrix row, e.g. `debian:12`."""
        chosen = load_matrix().select([selector]).distros[:1]
        if not chosen:
            raise ConfigurationError(f"unknown distribution {selector!r}")
        image, source = self.resolve_image(chosen[0], arch)
        if image is None:
            raise ConfigurationError(f"no image for {chosen[0].name} here: {source}")
        return image, source, chosen[0].name

    async def prepare(self, artifact: Artifact, distro: Distro) -> PreparedRow:
        image, source = await asyncio.to_thread(self.resolve_image, distro, artifact.arch)
        if image is None:
            return PreparedRow(source, lambda _: source, lambda _: no_sandbox())
        return PreparedRow(
            source,
            lambda scenario: shell_less_skip(distro, scenario),
            lambda scenario: self.cell_sandbox(image, artifact, distro, scenario),
        )

    def cell_sandbox(
        self, image: str, artifact: Artifact, distro: Distro, scenario: Scenario
    ) -> SandboxFactory:
        """A container of `image` with the scenario's options, removed afterwards."""
        options: dict[str, Any] = {"platform": artifact.platform, "read_only": scenario.read_only}
        if scenario.tmpfs:
            options["tmpfs"] = dict(scenario.tmpfs)
        if scenario.user:
            options["user"] = scenario.user
        if distro.command:
            options["command"] = distro.command
        emulated = scenario.browser and artifact.arch is not self.native_arch()
        if emulated:
            # Chromium under QEMU's user emulation starts and renders tens of times
            # slower: the runtime's per-call browser deadline is raised in the
            # container's environment, as an operator's image may raise it.
            options["environment"] = {BROWSER_CALL_TIMEOUT_ENV: str(EMULATED_BROWSER_CALL_S)}

        @contextlib.asynccontextmanager
        async def open_sandbox() -> AsyncIterator[Sandbox]:
            async with self._emulated_browser if emulated else contextlib.nullcontext():
                with RunningContainer(
                    self.client, image, policy=self.containers, **options
                ) as container:
                    yield container.sandbox

        return open_sandbox
