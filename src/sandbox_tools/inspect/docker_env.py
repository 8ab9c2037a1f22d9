"""`--sandbox docker_sdk` for inspect_ai: one container per sample through the Docker API.

inspect's own `docker` sandbox drives the `docker compose` CLI; this one needs only a
reachable engine (the `docker` Python SDK, as the rest of sandbox-tools uses), and it
makes the cases our runtime exists for one line of config: an image with no libc, a
read-only root with a tmpfs to install into, no network. Images are used as they are
on the engine (never pulled implicitly: an evaluation should not depend on a registry
at run time).

Config: a `DockerSdkConfig`, a JSON or YAML file of its fields, or an image name.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import os
import socket
from pathlib import Path
from typing import Any

from inspect_ai._util.error import PrerequisiteError  # inspect's "print the message only"
from inspect_ai.util import SandboxEnvironment, sandboxenv
from pydantic import BaseModel, Field, ValidationError, model_validator

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.errors import ConfigurationError, SandboxToolsError
from sandbox_tools.injector.acquire import acquire_addon, acquire_artifact
from sandbox_tools.injector.addon_copy import browser_mount, docker_addon_mounts
from sandbox_tools.inspect.provider_env import TIMEOUT_COMMAND, ProviderEnvironment
from sandbox_tools.inspect.tools import INSPECT_INJECTION, addons_wanted
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.docker import DockerSandbox
from sandbox_tools.sandboxes.docker_api import engine_api
from sandbox_tools.sandboxes.engines import docker_client

LABEL = "sandbox-tools.inspect"
# Which evaluation made a container: "<host>/<pid>/<the process's start time>". Cleanup
# without an id removes only containers whose evaluation is gone (not this host's live
# processes: another evaluation's running samples are not leftovers).
OWNER_LABEL = "sandbox-tools.inspect.owner"


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc has none): with
    the pid, it names one process, even once the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def this_evaluation() -> str:
    return f"{socket.gethostname()}/{os.getpid()}/{_process_start(os.getpid())}"


def evaluation_alive(owner: str | None) -> bool:
    """Whether the evaluation named by an OWNER_LABEL still runs. A container from another
    host, or with no such label, cannot be told apart from a live one: kept, as live."""
    host, _, rest = (owner or "").partition("/")
    pid, _, started = rest.partition("/")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    return bool(started) and _process_start(int(pid)) == started


class DockerSdkConfig(BaseModel, frozen=True, extra="forbid"):
    """How each sample's container is made (the fields mirror `docker run` options). An
    unknown field is refused: a misspelt `workdir` silently left the working directory at
    `/`, and the sample failed later, elsewhere."""

    image: str
    command: list[str] = Field(default_factory=lambda: ["sleep", "infinity"])
    user: str | None = None
    read_only: bool = False
    tmpfs: dict[str, str] | None = Field(default_factory=dict)  # None: none, as `docker run`
    network_mode: str = "none"
    working_dir: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    mem_limit: str | None = None
    pids_limit: int | None = None
    volumes: list[str] = Field(default_factory=list)  # "host:container[:ro]", as docker -v

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """An unknown field named, with the field it most likely meant; a field given as
        None (null in a file, a compose service's empty key) takes its default."""
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if value is not None}
            for key in data:
                if key not in cls.model_fields:
                    close = difflib.get_close_matches(str(key), cls.model_fields, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(
                        f"unknown field {key!r}{hint}; the fields are {', '.join(cls.model_fields)}"
                    )
        return data

    def __hash__(self) -> int:
        # inspect hashes sandbox specs (`sandbox=("docker_sdk", DockerSdkConfig(...))`):
        # the generated hash fails on the list and dict fields, so hash their JSON.
        return hash(self.model_dump_json())


CONFIG_FIELDS = (
    "Its fields are those of sandbox_tools.inspect.DockerSdkConfig (docs/INSPECT.md in "
    "sandbox-tools' repository says what each does)."
)


def explained(error: ValidationError) -> str:
    """pydantic's errors as one line each: the field and what is wrong, nothing more."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'config'}: "
        f"{str(item['msg']).removeprefix('Value error, ')}"
        for item in error.errors()
    )


def docker_sdk_config(config: Any) -> DockerSdkConfig:
    """The docker_sdk sandbox's config from what inspect passes: a config, a file or an image."""
    if isinstance(config, DockerSdkConfig):
        return config
    if isinstance(config, str) and config:
        path = Path(config)
        if path.suffix in (".json", ".yaml", ".yml") and path.is_file():
            import yaml  # inspect_ai depends on PyYAML; JSON is YAML too

            try:
                fields = yaml.safe_load(path.read_text())
                if isinstance(fields, dict) and "services" in fields:
                    raise ConfigurationError(
                        f"{path} is a compose file; the docker_sdk sandbox reads the fields of "
                        "DockerSdkConfig (image, user, working_dir, ...), not compose services",
                        remedy='Keep sandbox="docker" for a compose file (our tools work '
                        "there too), or move `image`, `user`, `working_dir`, ... of its service "
                        "to the top level of a docker_sdk config (docs/INSPECT.md).",
                    )
                return DockerSdkConfig.model_validate(fields)
            except ValidationError as exc:
                raise ConfigurationError(
                    f"{path}: not a docker_sdk sandbox config: {explained(exc)}",
                    remedy=CONFIG_FIELDS,
                ) from None
            except (yaml.YAMLError, ValueError) as exc:
                raise ConfigurationError(
                    f"{path}: not a docker_sdk sandbox config: {exc}", remedy=CONFIG_FIELDS
                ) from None
        return DockerSdkConfig(image=config)
    raise ConfigurationError(
        f"the docker_sdk sandbox needs a DockerSdkConfig or an image name, not {config!r}"
    )


def _image_named_by(client: Any, config: str) -> str:
    """The image a string config names. inspect turns a relative config into a path
    under the task's directory (`my-image:tag` arrives as `/task/dir/my-image:tag`), so
    the name is read back from the end: the longest tail that is an image on the engine."""
    import docker

    parts = config.split("/")
    tails = ["/".join(parts[n:]) for n in range(len(parts)) if parts[n]]
    for tail in tails:
        try:
            client.images.get(tail)
            return tail
        except (docker.errors.ImageNotFound, docker.errors.APIError):
            continue
    raise ConfigurationError(
        f"no image named by {config!r} is on the Docker engine (inspect puts the task's "
        f"directory in front of a relative config; tried {', '.join(map(repr, tails[-3:]))})",
        remedy="Pull or build the image first (the docker_sdk sandbox never pulls during "
        "an evaluation), or pass DockerSdkConfig(image=...).",
    )


def resolved_config(client: Any, config: Any) -> DockerSdkConfig:
    """The config inspect passed, with an image-name string resolved on the engine."""
    import docker

    if isinstance(config, str) and not Path(config).is_file():
        if Path(config).suffix in (".json", ".yaml", ".yml"):
            raise ConfigurationError(
                f"the docker_sdk sandbox config file {config} does not exist",
                remedy="A relative path is read from the task's directory.",
            )
        return DockerSdkConfig(image=_image_named_by(client, config))
    resolved = docker_sdk_config(config)
    try:
        client.images.get(resolved.image)
    except docker.errors.ImageNotFound:
        raise ConfigurationError(
            f"image {resolved.image!r} is not on the Docker engine",
            remedy="Pull or build it first: the docker_sdk sandbox never pulls during an "
            "evaluation.",
        ) from None
    return resolved


def _run(config: Any, task_name: str) -> Any:
    client = docker_client()
    config = resolved_config(client, config)
    options: dict[str, Any] = {
        "command": config.command,
        "detach": True,
        "read_only": config.read_only,
        "network_mode": config.network_mode,
        "environment": config.environment,
        "labels": {LABEL: task_name, OWNER_LABEL: this_evaluation()},
        "init": True,  # reaps orphans: processes the agent leaves behind do not pile up
    }
    if config.tmpfs:
        options["tmpfs"] = config.tmpfs
    if config.volumes:
        options["volumes"] = config.volumes
    for name in ("user", "working_dir", "mem_limit", "pids_limit"):
        if getattr(config, name) is not None:
            options[name] = getattr(config, name)
    # The browser add-on's checked tree, read-only: a sample's first browser call then
    # sends nothing (where the engine runs here and the add-on is on this host).
    mounts = (
        docker_addon_mounts(client, config.image, INSPECT_INJECTION)
        if ArtifactKind.BROWSER in addons_wanted()
        else []
    )
    if mounts:
        options["mounts"] = mounts
    return client, client.containers.run(config.image, **options)


def _remove(container: Any) -> None:
    import docker

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.remove(force=True)


def _container_defaults(container: Any) -> tuple[str, str | None]:
    """(working directory, user) the engine runs the container's execs with."""
    attrs = container.attrs if isinstance(container.attrs, dict) else {}
    config = attrs.get("Config") if isinstance(attrs.get("Config"), dict) else {}
    working_dir = config.get("WorkingDir") if isinstance(config, dict) else None
    user = config.get("User") if isinstance(config, dict) else None
    working_dir = working_dir if isinstance(working_dir, str) and working_dir else "/"
    return working_dir, user if isinstance(user, str) and user else None


@sandboxenv(name="docker_sdk")
class DockerSdkSandboxEnvironment(ProviderEnvironment):
    """A sample's container: files are read and written as its user through its shell
    (inspect's semantics), or by the engine where the image has no shell; execs with a
    timeout run under its `timeout`, where it has one."""

    sandbox: DockerSandbox
    shell_files = True
    timeout_command = TIMEOUT_COMMAND

    @classmethod
    def for_container(cls, container: Any, client: Any) -> DockerSdkSandboxEnvironment:
        working_dir, user = _container_defaults(container)
        return cls(DockerSandbox(container, client), working_dir, user)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: Any, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        client, container = await asyncio.to_thread(_run, config, task_name)
        return {"default": cls.for_container(container, client)}

    async def provider_has(self, path: str) -> bool:
        return await self.sandbox.exists(path)

    async def provider_write_file(self, path: str, data: bytes, file: str) -> None:
        if await self.sandbox.is_directory(path):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        await self.sandbox.write_file(path, data)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """inspect reads a config object back from the log it wrote (at the end of every
        eval, and for `inspect log dump`): without this the eval's log was unreadable."""
        return DockerSdkConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: Any) -> None:
        """Fail at the start of the task, once, where no sample could work: the image
        is not on the engine, or no runtime artifact can be had for its architecture."""

        def check() -> None:
            client = docker_client()
            image = client.images.get(resolved_config(client, config).image)
            arch = Arch.parse(str(image.attrs.get("Architecture") or os.uname().machine))
            acquire_artifact(arch)
            for kind in sorted(addons_wanted()):  # its tools made: web_browser(), computer()
                acquire_addon(kind, arch)
            if ArtifactKind.BROWSER in addons_wanted() and engine_api(client).on_this_host:
                # Its tree unpacked for the samples' mounts now, once, not in a sample.
                browser_mount(arch, INSPECT_INJECTION)

        try:
            await asyncio.to_thread(check)
        except SandboxToolsError as exc:
            # inspect prints a PrerequisiteError as its message alone: the one actionable
            # message, not the last line of a traceback of the eval's task groups.
            raise PrerequisiteError(f"docker_sdk sandbox: {exc.explained()}") from None

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: Any,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, DockerSdkSandboxEnvironment):
                await asyncio.to_thread(_remove, environment.sandbox.container)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup docker_sdk [ID]`: with an id, the containers of that
        task (or that container id); without, what interrupted evaluations left: each
        labelled container whose evaluation process no longer runs on this host. The
        containers of a live evaluation, or of another host's, are kept, and counted."""

        def remove() -> tuple[int, int]:
            client = docker_client()
            removed = kept = 0
            for container in client.containers.list(
                all=True, ignore_removed=True, filters={"label": LABEL}
            ):
                labels = container.labels
                if id is not None:
                    chosen = id in (labels.get(LABEL), container.id, container.short_id)
                else:
                    chosen = not evaluation_alive(labels.get(OWNER_LABEL))
                if chosen:
                    _remove(container)
                    removed += 1
                else:
                    kept += id is None
            return removed, kept

        removed, kept = await asyncio.to_thread(remove)
        # `inspect sandbox cleanup docker_sdk` otherwise prints nothing at all.
        print(f"docker_sdk: removed {removed} container(s) labelled {LABEL}")
        if kept:
            print(
                f"docker_sdk: kept {kept} container(s) of evaluations still running (or made "
                f"on another host); `inspect sandbox cleanup docker_sdk <task or container id>` "
                "removes them"
            )
