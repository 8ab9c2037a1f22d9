"""Docker engines to spread work across: this machine's and any others the user names.

No scheduler of our own: each engine is an ordinary Docker endpoint (a `DOCKER_HOST`-style
URL or a docker context), and the caller gives each one its share. An engine that cannot
be reached is kept, with the reason, so its share is reported instead of silently lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import docker
from docker import DockerClient

from sandbox_tools.artifacts import TextEnum
from sandbox_tools.errors import ConfigurationError, EngineUnavailableError
from sandbox_tools.settings import load_settings


def docker_client(concurrency: int | None = None) -> DockerClient:
    """A client for the engine named by the environment (DOCKER_HOST, default socket),
    running at most `concurrency` requests at once (the `engine-concurrency` setting;
    when not given, the settings as they stand: this is a library entry point)."""
    if concurrency is None:
        concurrency = load_settings().engine_concurrency
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineUnavailableError(f"no Docker engine answers: {exc}") from None
    return _limited(client, concurrency)


def _limited(client: DockerClient, concurrency: int) -> DockerClient:
    from sandbox_tools.sandboxes.docker_api import engine_api

    engine_api(client, concurrency)
    return client


URL_SCHEMES = ("unix://", "tcp://", "ssh://", "http://", "https://", "npipe://")


class EngineKind(TextEnum):
    DOCKER = "docker"  # a Docker endpoint: containers through its API
    MODAL = "modal"  # Modal: each cell or build in its own Modal sandbox, no client here


@dataclass(frozen=True)
class Engine:
    """Somewhere to run containers, and whether it can be used."""

    label: str  # as the user named it: "default", a URL, a context name, or "modal"
    client: DockerClient | None  # a Docker client; None for modal, or when unreachable
    error: str = ""  # why it cannot be used; empty when it can
    kind: EngineKind = EngineKind.DOCKER

    @property
    def available(self) -> bool:
        return not self.error and (self.client is not None or self.kind is EngineKind.MODAL)


def _base_url(spec: str) -> str:
    if spec.startswith(URL_SCHEMES):
        return spec
    from docker.context import ContextAPI

    context = ContextAPI.get_context(spec)
    if context is None:
        raise ConfigurationError(
            f"--engine {spec!r} is neither a Docker URL (unix://, tcp://, ssh://) nor a "
            "docker context",
            remedy="List contexts with `docker context ls`, or give the engine's URL.",
        )
    return str(context.Host)


def connect_engine(spec: str, concurrency: int) -> Engine:
    """An engine from a spec (default, a URL, a docker context, modal); unreachable ones carry
    the reason instead of raising, so a run can report every engine."""
    if spec == "modal":
        from sandbox_tools.sandboxes.modal_config import modal_unavailable

        return Engine(spec, None, modal_unavailable() or "", kind=EngineKind.MODAL)
    try:
        if spec == "default":
            return Engine(spec, docker_client(concurrency))
        client = docker.DockerClient(base_url=_base_url(spec), timeout=300)
        client.ping()
        return Engine(spec, _limited(client, concurrency))
    except (docker.errors.DockerException, EngineUnavailableError) as exc:
        return Engine(spec, None, str(exc)[:300])


def local_engine(concurrency: int | None = None) -> Engine:
    """The engine the environment names (DOCKER_HOST, else the default socket), with the
    settings' concurrency when none is given (as `docker_client`)."""
    return Engine("default", docker_client(concurrency))


def connect_engines(specs: Sequence[str], concurrency: int) -> list[Engine]:
    """Every engine named once; fails only when none of them answers."""
    engines = [connect_engine(spec, concurrency) for spec in dict.fromkeys(specs or ["default"])]
    if not any(engine.available for engine in engines):
        reasons = "; ".join(f"{e.label}: {e.error}" for e in engines)
        raise EngineUnavailableError(f"no Docker engine answers ({reasons})")
    return engines
