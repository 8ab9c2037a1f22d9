"""What a Modal sandbox is made from, and whether Modal can be used here at all.

The configuration (image, resources, timeouts), read from a compose file the way
inspect_ai's sandboxes are described, and the credential and SDK checks; the provider
itself is modal.py. Nothing here talks to Modal.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sandbox_tools.errors import ConfigurationError

CREDENTIALS_REMEDY = (
    "Set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (or run `modal token new`, which writes "
    "~/.modal.toml)."
)


@dataclass(frozen=True, kw_only=True)
class ModalConfig:
    """One sample's sandbox. Defaults suit an evaluation sample; all are overridable."""

    image: str = "debian:bookworm-slim"
    app_name: str = "sandbox-tools"
    timeout: int = 3600  # the sandbox's lifetime, seconds
    workdir: str = "/"
    cpu: float | None = None
    memory: int | None = None  # MiB
    gpu: str | None = None
    ports: tuple[int, ...] = ()
    volumes: Mapping[str, str] = field(default_factory=dict)  # mount path -> Modal volume
    env: Mapping[str, str] = field(default_factory=dict)
    retries: int = 4

    def __hash__(self) -> int:
        # inspect hashes sandbox specs; the generated hash fails on the mapping fields.
        return hash(
            (
                *(getattr(self, f.name) for f in fields(self) if f.name not in ("volumes", "env")),
                tuple(sorted(self.volumes.items())),
                tuple(sorted(self.env.items())),
            )
        )


def _parse_memory(value: Any) -> int | None:
    """Compose memory ("2g", "512m", bytes) as MiB."""
    if value is None:
        return None
    text = str(value).strip().lower().removesuffix("b")
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    if text and text[-1] in units:
        return max(1, int(float(text[:-1]) * units[text[-1]]))
    return max(1, int(int(text) / (1024 * 1024)))


def config_from_compose(document: Mapping[str, Any], service: str | None = None) -> ModalConfig:
    """A compose service's image, cpus, memory, gpu, ports and volumes as a ModalConfig."""
    services = document.get("services") or {}
    if not services:
        raise ConfigurationError("the compose file defines no services")
    name = service or ("default" if "default" in services else next(iter(services)))
    if name not in services:
        raise ConfigurationError(f"no service {name!r} in the compose file")
    spec = services[name] or {}
    if "image" not in spec:
        raise ConfigurationError(
            f"service {name!r} has no image",
            remedy="Modal builds from a registry image: set `image:` (build: is not supported).",
        )
    resources = (spec.get("deploy") or {}).get("resources") or {}
    limits = resources.get("limits") or {}
    gpu = spec.get("x-gpu") or spec.get("x-modal-gpu")
    for device in (resources.get("reservations") or {}).get("devices") or []:
        if "gpu" in (device.get("capabilities") or []):
            gpu = gpu or f"any:{device.get('count', 1)}"
    ports = []
    for port in spec.get("ports") or []:
        text = str(port.get("target") if isinstance(port, Mapping) else port)
        ports.append(int(text.split("/")[0].rsplit(":", 1)[-1]))
    volumes = {}
    for volume in spec.get("volumes") or []:
        source, _, target = str(volume).partition(":")
        if not target or source.startswith((".", "/")):
            raise ConfigurationError(
                f"volume {volume!r}: Modal mounts named volumes only (NAME:/path)"
            )
        volumes[target.split(":")[0]] = source
    cpus = spec.get("cpus") or limits.get("cpus")
    environment = spec.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment if "=" in item)
    return ModalConfig(
        image=str(spec["image"]),
        workdir=str(spec.get("working_dir") or "/"),
        cpu=float(cpus) if cpus is not None else None,
        memory=_parse_memory(spec.get("mem_limit") or limits.get("memory")),
        gpu=str(gpu) if gpu else None,
        ports=tuple(ports),
        volumes=volumes,
        env={str(k): str(v) for k, v in environment.items()},
    )


def load_compose(path: Path, service: str | None = None) -> ModalConfig:
    """A ModalConfig from a compose file's `default` service (or the first)."""
    import yaml  # in the [modal] extra

    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read compose file {path}: {exc}") from None
    return config_from_compose(document or {}, service)


def credentials_present() -> bool:
    """Whether Modal can authenticate here (tests skip, with this reason, when it cannot)."""
    return bool(
        (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"))
        or Path(os.environ.get("MODAL_CONFIG_PATH", Path.home() / ".modal.toml")).exists()
    )


def modal_unavailable() -> str | None:
    """Why Modal cannot be used from here (no SDK, no credentials), or None."""
    try:
        import modal  # noqa: F401
    except ImportError:
        return "the modal SDK is not installed (pip install 'sandbox-tools[modal]')"
    if not credentials_present():
        return f"no Modal credentials found: {CREDENTIALS_REMEDY}"
    return None


def _sdk() -> Any:
    try:
        import modal
    except ImportError:
        raise ConfigurationError(
            "the Modal provider needs the modal SDK",
            remedy="pip install 'sandbox-tools[modal]'",
        ) from None
    if not credentials_present():
        raise ConfigurationError("no Modal credentials found", remedy=CREDENTIALS_REMEDY)
    return modal
