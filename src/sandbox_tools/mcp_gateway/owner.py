"""Which gateway process made a container, so `tools cleanup --mcp` can tell what a
killed gateway left behind from what a live one still uses.

The owner is "<host name>/<pid namespace>/<pid>/<start time>": the pid alone could be a
later process's once the gateway is gone (the start time tells them apart); a gateway in
another pid namespace (a container with the host's name) is not seen by its pid; and an
engine reached over DOCKER_HOST may hold containers of gateways on other hosts. A
gateway in another namespace or on another host is never judged gone.
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


def gateway_owner() -> str:
    """This process, as the owner label writes it."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{_pid_namespace()}/{pid}/{_start_time(pid) or '0'}"


def owner_state(label: str) -> Owner:
    """Whether the gateway an owner label names still runs (on this host, in this pid
    namespace)."""
    parts = label.split("/")
    if len(parts) != 4:
        return Owner.ELSEWHERE
    host, namespace, pid_text, started = parts
    here = _pid_namespace()
    if host != socket.gethostname() or namespace != here or here == "?":
        return Owner.ELSEWHERE
    if not pid_text.isdigit() or not started:
        return Owner.ELSEWHERE
    now = _start_time(int(pid_text))
    if now is None or (started != "0" and now != started):
        return Owner.GONE
    return Owner.ALIVE
