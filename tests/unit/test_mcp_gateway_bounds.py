"""What the gateway refuses or bounds before anything reaches the engine or the client:
each case is an attack an attacker walk made (a container reached that the user never
named, an option that wedged the engine, a repository choosing the runtime, terminal
control sequences sent to the user's terminal, a label an image carries) and now fails."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from sandbox_tools.errors import RefusedToolCall, RuntimeTransportError
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.mcp_gateway.browser import relayed
from sandbox_tools.mcp_gateway.cleanup import _verdict
from sandbox_tools.mcp_gateway.isolation import (
    DEFAULT_MASKED,
    DEFAULT_READ_ONLY,
    Volume,
    joined_by,
)
from sandbox_tools.mcp_gateway.owner import gateway_owner
from sandbox_tools.mcp_gateway.registry import Sandboxes, attach_problem
from sandbox_tools.mcp_gateway.spec import (
    DEFAULT_CPUS,
    DEFAULT_MEMORY,
    DEFAULT_PIDS,
    LOG_CONFIG,
    ContainerSpec,
)
from sandbox_tools.mcp_gateway.tools import (
    ANSWER_CHARS,
    _ProgressOut,
    call_tool,
    printable,
    refusal,
)
from sandbox_tools.sandboxes.containers import (
    MCP_GATEWAY_LABEL,
    MCP_KEEP_LABEL,
    MCP_OWNER_LABEL,
    ContainerPolicy,
)
from sandbox_tools.settings import load_settings


def _no_engine() -> Any:
    raise AssertionError("this call must not reach the engine")


def _sandboxes(attachable: tuple[str, ...] = ()) -> Sandboxes:
    return Sandboxes(_no_engine, InjectionOptions(), ContainerPolicy(), attachable=attachable)


@pytest.mark.parametrize(
    "container", ["postgres", "3f2a", "a" * 64, "sandbox-tools-mcp-0000", "", "my-dev "]
)
async def test_attach_reaches_only_a_container_the_user_listed_and_says_the_same_for_all(
    container: str,
) -> None:
    answer = await call_tool(_sandboxes(("my-dev",)), "sandbox_attach", {"container": container})
    assert answer.is_error
    shown = repr(container[:80])
    assert answer.text == (
        f"container {shown} is not one this server may attach to. The user lists those "
        "when starting it (tools mcp --attach NAME; listed: my-dev); sandbox_create makes "
        "a new container instead"
    )


def _attrs(name: str = "/dev", **host: Any) -> dict[str, Any]:
    """A container as the engine describes it, with the engine's default masks."""
    labels = host.pop("labels", {})
    host = {
        "MaskedPaths": sorted(DEFAULT_MASKED),
        "ReadonlyPaths": sorted(DEFAULT_READ_ONLY),
        **host,
    }
    return {"Id": "f" * 64, "Name": name, "HostConfig": host, "Config": {"Labels": labels}}


def _mounted(source: str) -> dict[str, Any]:
    return {**_attrs(), "Mounts": [{"Type": "bind", "Source": source, "Destination": "/x"}]}


def _volume(name: str) -> dict[str, Any]:
    return {**_attrs(), "Mounts": [{"Type": "volume", "Name": name, "Destination": "/v"}]}


@pytest.mark.parametrize(
    ("named", "attrs", "said"),
    [
        ("dev", _attrs(), None),
        ("f" * 64, _attrs(), None),
        ("fff", _attrs(), "not on the engine under that exact name or id"),
        ("de", _attrs(), "not on the engine under that exact name or id"),
        ("dev", _attrs(Privileged=True), "not isolated from the host (privileged)"),
        ("dev", _attrs(NetworkMode="host"), "(the host's network namespace)"),
        ("dev", _attrs(PidMode="host", IpcMode="host"), "pid namespace; the host's ipc"),
        ("dev", _attrs(NetworkMode="container:a", PidMode="container:a"), "another contai"),
        ("dev", _attrs(CgroupnsMode="host"), None),  # a cgroup v1 engine's default
        ("dev", _attrs(CapAdd=["SYS_ADMIN", "SYS_PTRACE"]), "capability SYS_ADMIN"),
        ("dev", _attrs(CapAdd=["CAP_DAC_READ_SEARCH"]), "capability DAC_READ_SEARCH"),
        ("dev", _attrs(CapAdd=["SYS_PTRACE", "CHOWN"]), None),  # its own namespaces
        # The fourth attacker walk: NET_ADMIN acts on the host's network namespace
        # through the veth's peer (IFLA_TARGET_NETNSID).
        ("dev", _attrs(CapAdd=["NET_ADMIN"]), "capability NET_ADMIN"),
        ("dev", _attrs(CapAdd=["SYS_NICE"]), "capability SYS_NICE"),
        ("dev", _attrs(Devices=[{"PathOnHost": "/dev/sda"}]), "host devices"),
        ("dev", _attrs(DeviceCgroupRules=["b *:* rmw"]), "device cgroup rules"),
        ("dev", _attrs(SecurityOpt=["seccomp=unconfined"]), "seccomp=unconfined"),
        # A profile that allows everything is unconfined by another name.
        ("dev", _attrs(SecurityOpt=['seccomp={"defaultAction":"SCMP_ACT_ALLOW"}']), "seccomp"),
        ("dev", _attrs(SecurityOpt=["apparmor:unconfined"]), "apparmor:unconfined"),
        ("dev", _attrs(SecurityOpt=["apparmor=docker-default"]), None),
        ("dev", _attrs(SecurityOpt=["no-new-privileges"]), None),
        ("dev", _attrs(SecurityOpt=["systempaths=unconfined"]), "systempaths"),
        ("dev", _attrs(MaskedPaths=[]), "masks or makes read-only left open"),
        # The third attacker walk: /proc/sys writable, core_pattern run as root.
        ("dev", _attrs(ReadonlyPaths=[]), "masks or makes read-only left open"),
        ("dev", {**_attrs(), "HostConfig": {}}, "masks or makes read-only left open"),
        ("dev", _attrs(labels={MCP_GATEWAY_LABEL: "sbx-1"}), "made by an MCP gateway"),
    ],
)
def test_a_listed_container_is_attached_only_by_its_exact_name_and_only_if_isolated(
    named: str, attrs: dict[str, Any], said: str | None
) -> None:
    problem = attach_problem(named, attrs)
    assert (problem is None) if said is None else (problem is not None and said in problem)


PLAIN = Volume("local", {})
LINKS = {"/tmp/link-to-root": "/"}  # as a local engine's host resolves it


@pytest.mark.parametrize(
    ("attrs", "volumes", "trusted", "said"),
    [
        # Listed with --attach: no bind mount, no volume but the engine's plain storage.
        (_mounted("/home/me/project"), {}, False, "a bind mount of the host's /home/me/p"),
        (_mounted("/usr"), {}, False, "a bind mount of the host's /usr"),  # walk 3's list
        (_volume("data"), {"data": PLAIN}, False, None),
        (_volume("data"), {}, False, "volume data (driver ?"),  # not described: refused
        (_volume("rb"), {"rb": Volume("local", {"o": "rbind", "device": "/"})}, False, "vo"),
        (_volume("blk"), {"blk": Volume("local", {"type": "ext4", "device": "/dev/vda"})},
         False, "volume blk"),
        (_volume("pr"), {"pr": Volume("local", {"type": "proc", "device": "proc"})}, False,
         "volume pr"),
        (_volume("nfs"), {"nfs": Volume("nfs-plugin", {})}, False, "driver nfs-plugin"),
        # Listed with --attach-with-mounts: the user's call, but never the host itself.
        (_mounted("/home/me/project"), {}, True, None),
        (_mounted("/var/run/docker.sock"), {}, True, "the host's /var/run/docker.sock"),
        (_mounted("/"), {}, True, "the host's / mounted"),
        (_mounted("/tmp/link-to-root"), {}, True, "the host's /tmp/link-to-root mounted"),
        (_mounted("/run/docker"), {}, True, "the host's /run/docker mounted"),
        (_mounted("/var/lib/docker/overlay2"), {}, True, "overlay2 mounted"),
        (_mounted("/var"), {}, True, "the host's /var mounted"),
        (_volume("rb"), {"rb": Volume("local", {"o": "rbind", "device": "/"})}, True,
         "the host's / mounted"),
        # The fourth walk: a relative device is resolved from the engine's directory.
        (_volume("rel"), {"rel": Volume("local", {"o": "bind", "device": "../../etc"})},
         True, "a path the engine resolves itself"),
        (_volume("pr"), {"pr": Volume("local", {"type": "proc", "device": "none"})}, True,
         "mounts a proc file system of the host's"),
        (_volume("blk"), {"blk": Volume("local", {"type": "ext4", "device": "/dev/vda"})},
         True, "mounts a ext4 file system"),
        (_volume("mem"), {"mem": Volume("local", {"type": "tmpfs", "device": "tmpfs"})},
         True, None),
        (_volume("src"), {"src": Volume("local", {"o": "bind", "device": "/home/me/p"})},
         True, None),
    ],
)  # fmt: skip
def test_mounts_are_refused_unless_trusted_and_the_host_itself_even_then(
    attrs: dict[str, Any], volumes: dict[str, Volume], trusted: bool, said: str | None
) -> None:
    problem = attach_problem(
        "dev", attrs, volumes, mounts_trusted=trusted, resolve=lambda p: LINKS.get(p, p)
    )
    assert (problem is None) if said is None else (problem is not None and said in problem)
    if problem is not None and not trusted and "mount" in problem:
        assert "--attach-with-mounts" in problem


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (ContainerSpec(image="x", tmpfs={"/" + "a" * 45_000: "exec"}), "tmpfs path"),
        (ContainerSpec(image="x", tmpfs={"/tmp": "exec\nsize=1g"}), "tmpfs options"),
        (ContainerSpec(image="x", tmpfs={"/tmp,uid=0": ""}), "tmpfs path"),
        (ContainerSpec(image="x", tmpfs={"/": ""}), "other than /"),
        (ContainerSpec(image="x", tmpfs={f"/t{i}": "" for i in range(9)}), "at most 8 mounts"),
        (ContainerSpec(image="x", environment={f"V{i}": "" for i in range(257)}), "256 var"),
        (ContainerSpec(image="x", environment={"V": "x" * 70_000}), "characters in all"),
        (ContainerSpec(image="x", working_dir="relative"), "working_dir"),
        (ContainerSpec(image="x", working_dir="/" + "w" * 2000), "working_dir"),
        (ContainerSpec(image="x" * 600), "image must be"),
        (ContainerSpec(image="x", user="u" * 65), "user must be"),
        (ContainerSpec(image="x", mem_limit="lots"), "mem_limit"),
    ],
)
def test_an_option_no_engine_should_be_handed_is_refused_before_it_is(
    spec: ContainerSpec, said: str
) -> None:
    with pytest.raises(RefusedToolCall, match="sandbox_create: ") as refused:
        spec.check()
    assert said in refused.value.message and len(refused.value.message) < 2000


def test_every_container_gets_memory_process_cpu_and_log_bounds() -> None:
    spec = ContainerSpec(image="x")
    spec.check()
    options = spec.run_options(engine_cpus=8)
    assert options["mem_limit"] == DEFAULT_MEMORY and options["pids_limit"] == DEFAULT_PIDS
    assert options["nano_cpus"] == int(DEFAULT_CPUS * 1e9)
    assert options["log_config"] == LOG_CONFIG and options["init"] is True
    assert spec.run_options(engine_cpus=1)["nano_cpus"] == 1_000_000_000
    chosen = ContainerSpec(image="x", mem_limit="8g", pids_limit=50, cpus=0.5).run_options(8)
    assert (chosen["mem_limit"], chosen["pids_limit"], chosen["nano_cpus"]) == (
        "8g",
        50,
        500_000_000,
    )


async def test_the_bounds_reach_the_model_as_an_error_result() -> None:
    answer = await call_tool(
        _sandboxes(), "sandbox_create", {"image": "x", "tmpfs": {"/" + "a" * 45_000: ""}}
    )
    assert answer.is_error and "tmpfs path" in answer.text and len(answer.text) < 2000
    answer = await call_tool(_sandboxes(), "sandbox_create", {"image": "x", "pids_limit": 0})
    assert answer.is_error and "pids_limit" in answer.text


def test_terminal_control_sequences_never_reach_the_client() -> None:
    raw = (
        "\x1b[31mred\x1b[0m\r\n"  # colour, CRLF
        "\x1b]0;a new title\x07"  # window title
        "\x1b]52;c;ZXZpbA==\x07"  # clipboard
        "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ "  # hyperlink
        "over\rwrite\x00nul\x9bcsi\x7f"
    )
    shown = printable(raw)
    assert shown == "red\nlink over\\x0dwrite\\x00nul\\x9bcsi\\x7f"
    assert printable("tab\tand\nnewline stay") == "tab\tand\nnewline stay"


def test_cleanup_removes_only_what_a_gone_gateway_of_this_host_made_unkept() -> None:
    here = gateway_owner().split("/")
    dead = "/".join([*here[:3], "999999999", "1"])  # this host, boot and namespace; no pid
    ours = {MCP_GATEWAY_LABEL: "sbx-1", MCP_OWNER_LABEL: dead}
    name = "sandbox-tools-mcp-00000001"
    assert _verdict(name, ours, {}) is None
    assert "keep" in str(_verdict(name, {**ours, MCP_KEEP_LABEL: "1"}, {}))
    assert "still runs" in str(_verdict(name, {**ours, MCP_OWNER_LABEL: gateway_owner()}, {}))
    elsewhere = "/".join(["another-host", *here[1:]])
    assert "another host" in str(_verdict(name, {**ours, MCP_OWNER_LABEL: elsewhere}, {}))
    other_namespace = "/".join([*here[:2], "4026531999", *here[3:]])
    assert "another pid namespace" in str(
        _verdict(name, {**ours, MCP_OWNER_LABEL: other_namespace}, {})
    )
    assert "another host" in str(_verdict(name, {MCP_GATEWAY_LABEL: "sbx-1"}, {}))
    # An image can carry the labels: a user's container of it is never taken for ours,
    # nor once the image is gone (then it cannot be told), nor under another name.
    assert "its image carries" in str(_verdict(name, ours, {MCP_GATEWAY_LABEL: "sbx-1"}))
    assert "its image carries" in str(_verdict(name, ours, {MCP_OWNER_LABEL: dead}))
    keeps = _verdict(name, {**ours, MCP_KEEP_LABEL: "1"}, {MCP_KEEP_LABEL: "1"})
    assert "its image carries" in str(keeps)
    assert "its image is gone" in str(_verdict(name, ours, None))
    assert "names its containers" in str(_verdict("my-database", ours, {}))


def test_a_project_file_is_not_read_where_the_caller_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "pyproject.toml"
    project.write_text('[tool.sandbox-tools]\nkeep-containers = true\ndist = "evil"\n')
    assert load_settings({}, project).keep_containers
    monkeypatch.chdir(tmp_path)
    assert load_settings({}).dist is not None
    clean = load_settings({}, read_project=False)
    assert not clean.keep_containers and clean.dist is None


async def test_sandbox_list_shows_the_containers_the_user_listed_for_attach() -> None:
    answer = await call_tool(_sandboxes(("my-dev", "db")), "sandbox_list", {})
    assert answer.structured == {"sandboxes": [], "attachable": ["db", "my-dev"]}
    assert "(pass the name exactly as shown): db, my-dev" in answer.text
    none = await call_tool(_sandboxes(), "sandbox_list", {})
    assert "The user listed no containers for sandbox_attach." in none.text


def _png(width: int, height: int) -> str:
    """A PNG's signature and header chunk, declaring its size (what the check reads)."""
    header = struct.pack(">II", width, height) + bytes([8, 6, 0, 0, 0])
    chunk = struct.pack(">I", len(header)) + b"IHDR" + header + b"\0\0\0\0"
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk).decode()


def test_a_browser_answer_passes_one_image_of_a_screenshots_size_at_most() -> None:
    """A runtime that is not ours answered a screenshot with 8 images, each a small PNG
    declaring 60000x60000 pixels (14 GB once the client decodes it)."""
    shot = types.ImageContent(type="image", data=_png(1280, 1080), mimeType="image/png")
    many = types.CallToolResult(content=[shot] * 8)
    passed = relayed(many, 1000)
    assert passed.images == (shot.data,) and passed.text.count("not passed on") == 7
    bomb = types.ImageContent(type="image", data=_png(60000, 60000), mimeType="image/png")
    with pytest.raises(RuntimeTransportError, match="60000x60000 image"):
        relayed(types.CallToolResult(content=[bomb]), 1000)
    jpeg = types.ImageContent(type="image", data=shot.data, mimeType="image/jpeg")
    with pytest.raises(RuntimeTransportError, match="not a PNG"):
        relayed(types.CallToolResult(content=[jpeg]), 1000)


def test_control_characters_shown_as_text_still_fit_the_answers_bound() -> None:
    """Each control character is shown as four (\\xNN): 99,000 of them came back as
    400,091 characters when the text was cut before it was made printable."""
    answer = refusal("\x01" * 99_000)
    assert len(answer.text) <= ANSWER_CHARS + 200 and answer.text.startswith("\\x01")


async def test_progress_messages_are_joined_to_a_few_a_second() -> None:
    sent: list[str] = []

    async def progress(message: str) -> None:
        sent.append(message)

    out = _ProgressOut(progress)
    for _ in range(1000):  # a job printing a byte at a time, faster than the interval
        await out("x")
    await out.flush()
    assert len(sent) <= 3 and "".join(sent) == "x" * 1000


def test_a_container_whose_namespaces_another_joins_is_found() -> None:
    """The fourth walk: a clean listed container whose pid namespace a sidecar with the
    engine's socket joined; as root in it, the agent reached the sidecar's files
    through /proc/<pid>/root."""
    me = "a" * 64
    others = [
        {"Name": "/sidecar", "HostConfig": {"PidMode": f"container:{me}"}},
        {"Name": "/netpeer", "HostConfig": {"NetworkMode": "container:dev"}},
        {"Name": "/alone", "HostConfig": {"NetworkMode": "bridge", "PidMode": ""}},
    ]
    found = joined_by(me, "dev", others)
    assert found == [
        "container sidecar shares its pid namespace",
        "container netpeer shares its network namespace",
    ]
    assert joined_by(me, "dev", others[2:]) == []
