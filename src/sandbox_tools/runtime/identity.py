"""Who a tool acts as: the `user` parameter of PROTOCOL.md *Identities*.

inspect_ai sends the sandbox's default exec identity as an object of exact ids (the
agent's uid may have no passwd entry at all), while people write names or numeric
ids; all three mean "these uid, gid and groups", so they are parsed here once, at
the edge, into `UserSpec`, and resolved into the `Identity` a child is started with.
Switching is done by the kernel when the child starts (or by a forked child before it
touches any file), never by checking permissions ourselves.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from sandbox_tools.runtime.jsonrpc import InvalidParams, Params, ToolError

_NUMERIC = re.compile(r"(\d{1,12})(?::(\d{1,12}))?")
MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel
MAX_GROUPS = 65536  # NGROUPS_MAX on Linux


@dataclass(frozen=True)
class UserSpec:
    """A requested identity, validated but not yet looked up.

    Exactly one of `name` and `uid` is set. `gid`, `groups` and `home` are only
    given by numeric forms and identity objects; what is missing comes from the
    passwd entry when one exists.
    """

    name: str | None = None
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    home: str | None = None

    def describe(self) -> str:
        if self.name is not None:
            return f"user {self.name!r}"
        gid = "" if self.gid is None else f":{self.gid}"
        return f"uid {self.uid}{gid}"


def _id(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InvalidParams(
            f'Invalid params: field "{field}" must be an integer id from 0 to {MAX_ID}, '
            f"got {value!r}"
        )
    return value


def parse_user(params: Params, field: str = "user") -> UserSpec | None:
    """The `user` param: None, a name, "uid" / "uid:gid", or {uid, gid, groups, home}."""
    value = params.get(field)
    if value is None:
        return None
    if isinstance(value, str):
        numeric = _NUMERIC.fullmatch(value)
        if numeric:
            uid = _id(int(numeric.group(1)), field)
            gid = _id(int(numeric.group(2)), field) if numeric.group(2) else None
            return UserSpec(uid=uid, gid=gid)
        starts_well = value[:1].isalpha() or value[:1] == "_"
        if not starts_well or any(c in value for c in ":/\x00\n"):
            raise InvalidParams(
                f'Invalid params: field "{field}" must be a user name, "uid", "uid:gid" or an '
                f"identity object, got {value!r}"
            )
        return UserSpec(name=value)
    if isinstance(value, dict):
        # Unknown members are ignored: a newer host may send more than we use.
        if "uid" not in value:
            raise InvalidParams(f'Invalid params: field "{field}.uid" is required')
        uid = _id(value["uid"], f"{field}.uid")
        gid = None if value.get("gid") is None else _id(value["gid"], f"{field}.gid")
        groups = value.get("groups")
        if groups is not None:
            if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
                raise InvalidParams(
                    f'Invalid params: field "{field}.groups" must be a list of at most '
                    f"{MAX_GROUPS} integer ids"
                )
            groups = tuple(_id(g, f"{field}.groups[]") for g in groups)
        home = value.get("home")
        if home is not None and (not isinstance(home, str) or not home.startswith("/")):
            raise InvalidParams(
                f'Invalid params: field "{field}.home" must be an absolute path or null'
            )
        return UserSpec(uid=uid, gid=gid, groups=groups, home=home)
    raise InvalidParams(
        f'Invalid params: field "{field}" must be a string or an identity object, '
        f"got {type(value).__name__}"
    )


@dataclass(frozen=True)
class Identity:
    """Who a child runs as; uid/gid are None when it runs as the server's own user."""

    uid: int | None
    gid: int | None
    groups: list[int] | None
    home: str | None
    name: str | None

    @property
    def switches(self) -> bool:
        return self.uid is not None

    def describe(self) -> str:
        if self.name is not None:
            return f"user {self.name!r}"
        return f"uid {self.uid if self.uid is not None else os.geteuid()}"

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.home is not None:
            env["HOME"] = self.home
        if self.name is not None:
            env["USER"] = env["LOGNAME"] = self.name
        return env


SELF = Identity(None, None, None, None, None)


# The image's account files, read as data. The C library's look-ups (getpwnam,
# getgrouplist) go through NSS, which loads the shared libraries the image's
# /etc/nsswitch.conf names into the calling process: as root, the image's code in the
# runtime. Containers keep their accounts in these files.
PASSWD_FILE = "/etc/passwd"
GROUP_FILE = "/etc/group"
MAX_ACCOUNTS_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Account:
    """One line of the passwd file."""

    name: str
    uid: int
    gid: int
    home: str


def _table(path: str) -> list[list[str]]:
    """The colon-separated lines of an account file ([] if it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_ACCOUNTS_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def _number(field: str) -> int | None:
    return int(field) if field.isascii() and field.isdigit() and len(field) <= 12 else None


def _accounts() -> list[Account]:
    found = []
    for fields in _table(PASSWD_FILE):
        if len(fields) >= 6:
            uid, gid = _number(fields[2]), _number(fields[3])
            if uid is not None and gid is not None and fields[0]:
                found.append(Account(fields[0], uid, gid, fields[5]))
    return found


def _entry_by_name(name: str) -> Account | None:
    return next((a for a in _accounts() if a.name == name), None)


def _entry_by_uid(uid: int) -> Account | None:
    return next((a for a in _accounts() if a.uid == uid), None)


def _supplementary(entry: Account | None, gid: int) -> list[int]:
    """The primary group, then every group of the group file that lists the user."""
    groups = [gid]
    if entry is None:
        return groups
    for fields in _table(GROUP_FILE):
        if len(fields) >= 4 and entry.name in fields[3].split(","):
            number = _number(fields[2])
            if number is not None and number not in groups and len(groups) < MAX_GROUPS:
                groups.append(number)
    return groups


def resolve_user(spec: UserSpec | None) -> Identity:
    """The identity to start a child as, or a ToolError the model can act on."""
    if spec is None:
        return SELF
    if spec.name is not None:
        entry = _entry_by_name(spec.name)
        if entry is None:
            raise ToolError(f"user {spec.name!r} does not exist in this container")
        uid = entry.uid
    else:
        assert spec.uid is not None
        uid = spec.uid
        entry = _entry_by_uid(uid)
    # A uid with no passwd entry gets its own number as group, not root's group 0.
    gid = spec.gid if spec.gid is not None else (entry.gid if entry else uid)
    groups = list(spec.groups) if spec.groups is not None else _supplementary(entry, gid)
    home = spec.home or (entry.home if entry else None) or "/"
    name = entry.name if entry else None
    if uid == os.geteuid() and gid == os.getegid():
        return Identity(None, None, None, home, name)
    if os.geteuid() != 0:
        raise ToolError(
            f"cannot run as {spec.describe()}: the runtime runs as uid {os.geteuid()} "
            f"(gid {os.getegid()}), and only root can switch identities"
        )
    return Identity(uid, gid, groups, home, name)


def become(identity: Identity) -> None:
    """Switch this (forked, single-purpose) process to `identity` for good."""
    if identity.uid is None or identity.gid is None:
        return
    os.setgroups(identity.groups or [identity.gid])
    os.setgid(identity.gid)
    os.setuid(identity.uid)
