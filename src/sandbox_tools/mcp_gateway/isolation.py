"""Whether a container the user listed keeps whoever acts in it away from the host.

`sandbox_attach` gives the agent a shell in the container; a container that shares a
namespace with the host (directly, or through another container's), holds the engine's
socket or the host's root, has capabilities or devices that reach past its namespaces,
or runs without seccomp or AppArmor, hands the agent the host. The engine's own
description of the container (`docker inspect`) is read, nothing else: pure.
"""

from __future__ import annotations

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
# Host paths whose bind mount is the host: its root, the engines' sockets and state,
# and the directories that hold them.
HOST_PATHS = frozenset(
    {"/", "/run", "/var/run", "/var/lib/docker", "/var/lib/containerd", "/proc", "/sys", "/dev"}
)
ENGINE_SOCKETS = ("docker.sock", "containerd.sock", "podman.sock", "crio.sock")


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def host_reach(attrs: Any) -> list[str]:
    """What in the container's description reaches the host, one phrase each; empty if
    nothing does."""
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
    for option in _list(host.get("SecurityOpt")):
        text = str(option).replace(":", "=")
        if text in ("seccomp=unconfined", "apparmor=unconfined", "label=disable"):
            found.append(f"security option {option}")
    for mount in _list(_mapping(attrs).get("Mounts")):
        source = str(_mapping(mount).get("Source") or "")
        if _mapping(mount).get("Type") != "bind" or not source:
            continue
        normal = source.rstrip("/") or "/"
        if normal in HOST_PATHS or normal.endswith(ENGINE_SOCKETS):
            found.append(f"the host's {normal} mounted")
    return found
