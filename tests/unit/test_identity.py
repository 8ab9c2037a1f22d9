"""The `user` parameter (PROTOCOL.md *Identities*): parsed at the edge, resolved exactly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.runtime.identity import UserSpec, parse_user, resolve_user
from sandbox_tools.runtime.jsonrpc import InvalidParams, ToolError

ROOT = os.geteuid() == 0


@pytest.mark.parametrize(
    ("value", "spec"),
    [
        (None, None),
        ("agent", UserSpec(name="agent")),
        ("1000", UserSpec(uid=1000)),
        ("1000:1001", UserSpec(uid=1000, gid=1001)),
        (
            {"uid": 1000, "gid": 1000, "groups": [1000, 27], "home": "/home/a"},
            UserSpec(uid=1000, gid=1000, groups=(1000, 27), home="/home/a"),
        ),
        ({"uid": 0, "gid": 0, "groups": [], "home": None}, UserSpec(uid=0, gid=0, groups=())),
        ({"uid": 5, "future_field": True}, UserSpec(uid=5)),
    ],
)
def test_every_form_inspect_and_people_send_is_understood(value: Any, spec: Any) -> None:
    assert parse_user({"user": value}) == spec


@pytest.mark.parametrize(
    "value",
    [
        "",
        "a:b",
        "../etc",
        "x\x00y",
        "99999999999",
        "1" * 5000,
        "-1",
        7,
        True,
        [],
        {},
        {"uid": -1},
        {"uid": "0"},
        {"uid": True},
        {"uid": 2**32},
        {"uid": 1, "gid": 1.5},
        {"uid": 1, "groups": "0"},
        {"uid": 1, "groups": [0, "1"]},
        {"uid": 1, "home": "relative"},
    ],
)
def test_malformed_identities_are_invalid_params_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidParams, match='field "user'):
        parse_user({"user": value})


def test_our_own_identity_is_no_switch_and_sets_home() -> None:
    me = resolve_user(UserSpec(uid=os.geteuid(), gid=os.getegid(), groups=(), home="/srv/x"))
    assert not me.switches
    assert me.env()["HOME"] == "/srv/x"


@pytest.mark.skipif(not ROOT, reason="switching identities needs root")
def test_a_uid_without_a_passwd_entry_gets_exactly_the_ids_asked_for() -> None:
    exact = resolve_user(parse_user({"user": {"uid": 4242, "gid": 4343, "groups": [7]}}))
    assert (exact.uid, exact.gid, exact.groups, exact.home) == (4242, 4343, [7], "/")
    # No entry and no gid: its own number, never root's group 0.
    bare = resolve_user(parse_user({"user": "4242"}))
    assert (bare.uid, bare.gid, bare.groups) == (4242, 4242, [4242])


@pytest.mark.skipif(not ROOT, reason="switching identities needs root")
def test_a_named_user_that_does_not_exist_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match="does not exist"):
        resolve_user(UserSpec(name="no-such-user-here"))


@pytest.mark.skipif(ROOT, reason="needs a runtime that is not root")
def test_switching_without_root_is_a_tool_error_naming_the_identity() -> None:
    with pytest.raises(ToolError, match="cannot run as uid 4242:1"):
        resolve_user(UserSpec(uid=4242, gid=1))


def test_names_and_groups_come_from_the_account_files_never_through_nss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C library's look-ups load the NSS modules the image's nsswitch.conf names into
    the root runtime; the account files are read as data instead."""
    from sandbox_tools.runtime import identity

    passwd = tmp_path / "passwd"
    passwd.write_text(
        "root:x:0:0:root:/root:/bin/sh\n# a comment\nbroken line\n"
        "agent:x:1000:1000::/home/agent:/bin/bash\nodd:x:12a:1::/:/bin/sh\n"
    )
    group = tmp_path / "group"
    group.write_text("agent:x:1000:\nwheel:x:10:root,agent\naudio:x:29:other\ndocker:x:999:agent\n")
    monkeypatch.setattr(identity, "PASSWD_FILE", str(passwd))
    monkeypatch.setattr(identity, "GROUP_FILE", str(group))
    monkeypatch.setattr(identity.os, "geteuid", lambda: 0)
    agent = resolve_user(parse_user({"user": "agent"}))
    assert (agent.uid, agent.gid, agent.groups, agent.home) == (
        1000,
        1000,
        [1000, 10, 999],
        "/home/agent",
    )
    by_uid = resolve_user(parse_user({"user": "1000"}))
    assert by_uid.name == "agent" and by_uid.home == "/home/agent"
    with pytest.raises(ToolError, match="'odd' does not exist"):
        resolve_user(parse_user({"user": "odd"}))
    nobody = resolve_user(parse_user({"user": "4242"}))
    assert (nobody.uid, nobody.gid, nobody.groups, nobody.name) == (4242, 4242, [4242], None)
