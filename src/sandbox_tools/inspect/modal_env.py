"""`--sandbox modal` for inspect_ai: one Modal sandbox per sample, our provider underneath.

Config: none (defaults), a compose file (image, cpus, memory, gpu, ports, volumes,
environment, working_dir of the `default` service, or the first), or a `ModalConfig`.
If another installed package also registers `modal`, inspect_ai uses whichever it
loaded first; `--sandbox sandbox_tools/modal` always names this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_ai.util import SandboxEnvironment, sandboxenv

from sandbox_tools.errors import ConfigurationError
from sandbox_tools.inspect.provider_env import ProviderEnvironment
from sandbox_tools.sandboxes.modal import ModalSandbox, cleanup_leftovers
from sandbox_tools.sandboxes.modal_config import ModalConfig, load_compose

COMPOSE_FILES = ["compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"]


def modal_config(config: Any) -> ModalConfig:
    """The modal sandbox's config from what inspect passes: none, a compose file or a config."""
    if config is None:
        for name in COMPOSE_FILES:
            if Path(name).exists():
                return load_compose(Path(name))
        return ModalConfig()
    if isinstance(config, ModalConfig):
        return config
    if isinstance(config, str):
        return load_compose(Path(config))
    raise TypeError(f"modal sandbox config must be a compose file or ModalConfig, not {config!r}")


@sandboxenv(name="modal")
class ModalSandboxEnvironment(ProviderEnvironment):
    sandbox: ModalSandbox

    @classmethod
    def config_files(cls) -> list[str]:
        return COMPOSE_FILES

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> Any:
        """inspect reads a config object back from the log it wrote (at the end of every
        eval, and for `inspect log dump`): without this such a log was unreadable."""
        try:
            # JSON has no tuples: the config's sequences come back as lists.
            fields: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in config.items()
            }
            return ModalConfig(**fields)
        except TypeError as exc:
            raise ConfigurationError(f"not a modal sandbox config: {exc}") from None

    @classmethod
    async def sample_init(
        cls, task_name: str, config: Any, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        sandbox = await ModalSandbox.create(modal_config(config))
        return {"default": cls(sandbox)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: Any,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, ModalSandboxEnvironment):
                await environment.sandbox.cleanup()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        await cleanup_leftovers(id or ModalConfig().app_name)
