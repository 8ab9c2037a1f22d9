"""Which gateway process made a container, so `tools cleanup --mcp` can tell what a
killed gateway left behind from what a live one still uses.

The owner is "<host name>/<boot id>/<pid namespace>/<pid>/<start time>": the pid alone
could be a later process's once the gateway is gone (the start time tells them apart); a
gateway in another pid namespace (a container with the host's name) is not seen by its
pid; and an engine reached over DOCKER_HOST may hold containers of gateways on other
hosts, which may share a host name (`localhost`) and whose first pid namespace has the
same number as every kernel's: the boot id (random at each boot) tells those apart. A
gateway in another namespace, on another host, or from before this host's last boot is
never judged gone.
"""

from __future__ import annotations

import os
import socket
from enum import Enum


class Owner(Enum):
    ALIVE = "alive"
    GONE = "gone"
    ELSEWHERE = "elsewhere"  # another host's gateway, or a label this host cannot read


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc's field 22), or None
    if there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str:
    """This process's pid namespace, as the kernel names it ("4026531836"), or "?"."""
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"
    return link.removeprefix("pid:[").removesuffix("]")


def _boot_id() -> str:
    """This boot of this machine's kernel (random at each boot), or "?"."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return boot.read().strip() or "?"
    except OSError:
        return "?"


def gateway_owner() -> str:
    """This process, as the owner label writes it."""
    pid = os.getpid()
    started = _start_time(pid) or "0"
    return f"{socket.gethostname()}/{_boot_id()}/{_pid_namespace()}/{pid}/{started}"


def owner_state(label: str) -> Owner:
    """Whether the gateway an owner label names still runs (on this host, in this pid
    namespace)."""
    parts = label.split("/")
    if len(parts) != 5:
        return Owner.ELSEWHERE
    host, boot, namespace, pid_text, started = parts
    here, booted = _pid_namespace(), _boot_id()
    if host != socket.gethostname() or "?" in (here, booted):
        return Owner.ELSEWHERE
    if boot != booted or namespace != here:
        return Owner.ELSEWHERE
    if not pid_text.isdigit() or not started:
        return Owner.ELSEWHERE
    now = _start_time(int(pid_text))
    if now is None or (started != "0" and now != started):
        return Owner.GONE
    return Owner.ALIVE
