"""Whether a container the user listed keeps whoever acts in it away from the host.

`sandbox_attach` gives the agent a shell in the container. What reaches the host is
refused: privileges; a namespace shared with the host or another container; capabilities
or devices that reach past the container's namespaces; seccomp or AppArmor other than
the engine's defaults; `/proc` paths the engine masks or makes read-only by default left
open; and, unless the user trusts the container's mounts (`--attach-with-mounts`), any
bind mount or volume that is not the engine's own plain storage (a volume can bind a
host path, a device, or the host's procfs under another name). A list of dangerous host
paths cannot be complete (`/usr`, a crontab, a symbolic link swapped after the mount),
so mounts are the user's call, with the engine's sockets and `/` refused even then.
The engine's own description of the container (`docker inspect`) is read: pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox_tools.runtime.paths import ADDON_MOUNT_ROOT

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
# The capabilities a container may hold: the engine's defaults, and SYS_PTRACE (which
# reaches only its own pid namespace, no container joining it: see `joined_by`). Any
# other added capability is refused: NET_ADMIN reaches the host's network namespace
# through a veth's peer, SYS_ADMIN mounts, DAC_READ_SEARCH opens any host file by handle.
ALLOWED_CAPABILITIES = frozenset(
    {
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
        "SYS_PTRACE",
    }
)
# Volume file system types whose `device` is not a host path to judge: memory, and
# network shares (the user's to trust). Any other type (ext4 on a host disk, proc,
# sysfs, ...) is refused even with --attach-with-mounts.
REMOTE_OR_MEMORY_TYPES = frozenset({"tmpfs", "nfs", "nfs4", "cifs"})
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


def as_mapping(value: Any) -> dict[str, Any]:
    """A part of the engine's description that should be an object, or {} if it is not."""
    return value if isinstance(value, dict) else {}


def container_name(attrs: Any) -> str:
    """A container's name as `docker ps` shows it (the engine's has a leading /)."""
    return str(as_mapping(attrs).get("Name") or "").removeprefix("/")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# What the engine masks and makes read-only in /proc and /sys by default: a container
# with less has written to the host's kernel settings (core_pattern: code run as root).
DEFAULT_MASKED = frozenset(
    {"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
     "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
     "/sys/firmware"}
)  # fmt: skip
DEFAULT_READ_ONLY = frozenset(
    {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)


@dataclass(frozen=True)
class Volume:
    """A named volume as the engine describes it: its driver and driver options."""

    driver: str
    options: Mapping[str, str]

    @property
    def plain(self) -> bool:
        """The engine's own storage: the local driver, no options (no bind, no device,
        no file system of the host's)."""
        return self.driver == "local" and not self.options


def host_reach(
    attrs: Any,
    volumes: Mapping[str, Volume] | None = None,
    *,
    mounts_trusted: bool = False,
    resolve: Callable[[str], str] = lambda path: path,
    addon_trees: str | None = None,
) -> list[str]:
    """What in the container's description reaches the host, one phrase each; empty if
    nothing does. `volumes`: the named volumes it mounts, as the engine describes them
    (one it could not describe is not plain); `mounts_trusted`: the user accepted its
    bind mounts and volumes (then only `/` and the engines' sockets, followed through
    `resolve`, are refused). `addon_trees`: the host's directory of checked add-on
    trees; a read-only mount of one of them where we mount add-ons (what sandbox_create
    gives its containers) reaches nothing of the host's but that tree."""
    host = as_mapping(as_mapping(attrs).get("HostConfig"))
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
    for capability in sorted(added - ALLOWED_CAPABILITIES):
        found.append(f"capability {capability}")
    if _list(host.get("Devices")) or _list(host.get("DeviceRequests")):
        found.append("host devices")
    if _list(host.get("DeviceCgroupRules")):
        found.append("device cgroup rules (host devices)")
    for option in _list(host.get("SecurityOpt")):
        text = str(option).replace(":", "=", 1)
        if text.startswith(("seccomp=", "systempaths=", "label=disable")) or (
            text.startswith("apparmor=") and text != "apparmor=docker-default"
        ):
            found.append(f"security option {str(option)[:80]} (not the engine's default)")
    masked = {str(p) for p in _list(host.get("MaskedPaths"))}
    read_only = {str(p) for p in _list(host.get("ReadonlyPaths"))}
    if not masked >= DEFAULT_MASKED or not read_only >= DEFAULT_READ_ONLY:
        found.append("/proc or /sys paths the engine masks or makes read-only left open")
    known = volumes or {}
    for each in _list(as_mapping(attrs).get("Mounts")):
        mount = as_mapping(each)
        kind, name = str(mount.get("Type") or ""), str(mount.get("Name") or "")
        if kind == "bind":
            source = str(mount.get("Source") or "")
            if addon_trees and _our_addon(mount, resolve(source), resolve(addon_trees)):
                continue
        elif kind == "volume":
            volume = known.get(name, Volume("?", {"?": "?"}))
            if volume.plain:
                continue
            if not mounts_trusted:
                found.append(f"volume {name[:60]} (driver {volume.driver}, with options)")
                continue
            problem = _volume_problem(name, volume)
            if problem is not None:
                found.append(problem)
                continue
            source = str(volume.options.get("device") or "")
        else:
            continue  # tmpfs: memory of its own
        shown = source.rstrip("/") or "/"
        if not mounts_trusted and kind == "bind":
            found.append(f"a bind mount of the host's {shown}")
        elif source and (_always_host(source) or _always_host(resolve(source))):
            found.append(f"the host's {shown} mounted")
    return found


def _our_addon(mount: Mapping[str, Any], source: str, trees: str) -> bool:
    """A read-only bind of one of the host's checked add-on trees at our mount root."""
    target = str(mount.get("Destination") or "")
    return (
        mount.get("RW") is False
        and posixpath.dirname(target) == ADDON_MOUNT_ROOT
        and posixpath.dirname(source.rstrip("/")) == trees.rstrip("/")
    )


def _volume_problem(name: str, volume: Volume) -> str | None:
    """Why a volume is refused even with its mounts trusted: a file system of the host's
    (a disk, its procfs), or a device path the engine resolves from where it runs."""
    kind = volume.options.get("type", "none")
    device = volume.options.get("device", "")
    if kind in REMOTE_OR_MEMORY_TYPES:
        return None
    if kind != "none":
        return f"volume {name[:60]} mounts a {kind[:20]} file system of the host's"
    if device and not device.startswith("/"):
        return f"volume {name[:60]} binds {device[:60]!r}, a path the engine resolves itself"
    return None


def joined_by(container_id: str, name: str, others: Sequence[Any]) -> list[str]:
    """The containers (as the engine describes them) that share one of this container's
    namespaces: whoever acts in it reaches them (their processes through /proc, their
    loopback), and whatever they hold. Empty if none."""
    ours = {f"container:{container_id}", f"container:{name}"}
    found = []
    for other in others:
        host = as_mapping(as_mapping(other).get("HostConfig"))
        shared = [kind for kind, key in NAMESPACES if str(host.get(key) or "") in ours]
        if shared:
            other_name = container_name(other) or "?"
            found.append(f"container {other_name[:60]} shares its {', '.join(shared)} namespace")
    return found


def _always_host(path: str) -> bool:
    """A mount no trust makes safe: `/` and the engines' sockets and their directories."""
    normal = "/" + path.strip("/") if path.strip("/") else "/"
    return normal == "/" or normal.endswith(ENGINE_SOCKETS) or reaches_host(normal)
