"""Whether a container the user listed keeps whoever acts in it away from the host.

`sandbox_attach` gives the agent a shell in the container; a container that shares a
namespace with the host (directly, or through another container's), holds the engine's
socket or the host's root, has capabilities or devices that reach past its namespaces,
or runs without seccomp or AppArmor, hands the agent the host. The engine's own
description of the container (`docker inspect`) is read, nothing else: pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Namespaces a container may share, by the engine's key: "host" shares the host's, and
# "container:<id>" another container's, which may share the host's in turn.
NAMESPACES = (
    ("network", "NetworkMode"),
    ("pid", "PidMode"),
    ("ipc", "IpcMode"),
    ("user", "UsernsMode"),
    ("uts", "UTSMode"),
)
# Not among them: the cgroup namespace, which is the host's by default on a cgroup v1
# host (every container there), and gives nothing without privileges or SYS_ADMIN.
# Capabilities whose holder reaches past the container's namespaces (mounts, kernel
# modules, raw devices, reading any file by handle, the kernel's programs and logs).
HOST_CAPABILITIES = frozenset(
    {
        "ALL",
        "SYS_ADMIN",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_BOOT",
        "SYS_TIME",
        "DAC_READ_SEARCH",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "BPF",
        "PERFMON",
        "SYSLOG",
    }
)
# Host paths whose mount is the host: the engines' sockets and state, the kernel's
# interfaces, the host's configuration and root's home. A mount of one of them, of a
# path inside one, or of a directory that holds one (`/`, `/var`) reaches the host.
HOST_PATHS = (
    "/run",
    "/var/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/containers",
    "/var/lib/kubelet",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/etc",
    "/root",
)
ENGINE_SOCKETS = ("docker.sock", "containerd.sock", "podman.sock", "crio.sock")


def reaches_host(path: str) -> bool:
    """Whether a host path, mounted, reaches the host (see HOST_PATHS)."""
    normal = "/" + path.strip("/") if path.strip("/") else "/"
    if normal == "/" or normal.endswith(ENGINE_SOCKETS):
        return True
    return any(
        normal == held or normal.startswith(held + "/") or held.startswith(normal + "/")
        for held in HOST_PATHS
    )


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def host_reach(
    attrs: Any,
    volume_devices: Mapping[str, str] | None = None,
    resolve: Callable[[str], str] = lambda path: path,
) -> list[str]:
    """What in the container's description reaches the host, one phrase each; empty if
    nothing does. `volume_devices`: the host path each named volume binds (a local
    volume made with `o=bind,device=...` is a bind mount by another name); `resolve`:
    a host path with its symbolic links followed (where the engine shares this host's
    files), since the engine records a mount's source as it was written."""
    host = _mapping(_mapping(attrs).get("HostConfig"))
    found: list[str] = []
    if host.get("Privileged"):
        found.append("privileged")
    for kind, key in NAMESPACES:
        mode = str(host.get(key) or "")
        if mode == "host":
            found.append(f"the host's {kind} namespace")
        elif mode.startswith("container:"):
            found.append(f"another container's {kind} namespace")
    added = {str(c).upper().removeprefix("CAP_") for c in _list(host.get("CapAdd"))}
    for capability in sorted(added & HOST_CAPABILITIES):
        found.append(f"capability {capability}")
    if _list(host.get("Devices")) or _list(host.get("DeviceRequests")):
        found.append("host devices")
    if _list(host.get("DeviceCgroupRules")):
        found.append("device cgroup rules (host devices)")
    for option in _list(host.get("SecurityOpt")):
        text = str(option).replace(":", "=")
        if text in (
            "seccomp=unconfined",
            "apparmor=unconfined",
            "label=disable",
            "systempaths=unconfined",
        ):
            found.append(f"security option {option}")
    if "MaskedPaths" in host and not _list(host.get("MaskedPaths")):
        found.append("no masked /proc paths")
    devices = volume_devices or {}
    for mount in _list(_mapping(attrs).get("Mounts")):
        mount = _mapping(mount)
        if mount.get("Type") == "bind":
            source = str(mount.get("Source") or "")
        elif mount.get("Type") == "volume":
            source = devices.get(str(mount.get("Name") or ""), "")
        else:
            continue
        if source and (reaches_host(source) or reaches_host(resolve(source))):
            shown = source.rstrip("/") or "/"
            found.append(f"the host's {shown} mounted")
    return found
