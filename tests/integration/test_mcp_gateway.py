"""`tools mcp` (the console script's entry point) in a child process, driven by the `mcp`
SDK's stdio client as an MCP client (a coding agent) drives it: a Debian sandbox as
root and a libc-free busybox one as uid 1000 with a read-only root and no network, made
from offline-built images, with our built artifact injected; a shell that keeps its
state, files edited, jobs polled and killed; sandboxes listed and closed; what a client
gets wrong answered as error results; output bounded; a client that goes away leaving
no container the server made, but the one it attached to running; and a signal, even
mid-create, leaving none either.

The module's tests share one gateway and its two sandboxes (the client runs on an event
loop of its own thread, so plain tests can call it); the disconnection test starts its
own."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the [mcp] extra is not installed")

import docker.errors
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, ImageContent, TextContent

from sandbox_tools.mcp_gateway.browser import RUNTIME_TOOLS as RUNTIME_BROWSER_TOOLS
from sandbox_tools.mcp_gateway.registry import MAX_SANDBOXES
from sandbox_tools.mcp_gateway.spec import DEFAULT_CPUS, DEFAULT_PIDS, LOG_CONFIG
from sandbox_tools.mcp_gateway.tools import ANSWER_CHARS, RESULT_CHARS
from sandbox_tools.runtime.tools.bash_session.tool_types import MAX_WAIT_S
from sandbox_tools.sandboxes.containers import (
    MCP_GATEWAY_LABEL,
    MCP_OWNER_LABEL,
    OWNER_LABEL,
    RunningContainer,
)
from tests.support import (
    SRC,
    RawMcpServer,
    arches_under_test,
    ensure_target_image,
    eventually,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

CALL_TIMEOUT = 180.0
# Containers the module's gateway may attach to (`tools mcp --attach`): one never made,
# one made but stopped. Per process, so parallel runs on one engine do not meet.
MISSING = f"sandbox-tools-test-mcp-missing-{os.getpid()}"
STOPPED = f"sandbox-tools-test-mcp-stopped-{os.getpid()}"


class Gateway:
    """`tools mcp` and one `ClientSession` of it, held open on a thread's event loop until
    `close()` closes the client (the server's stdin) as a client that goes away does."""

    def __init__(self, env: dict[str, str], log: Path, attach: tuple[str, ...] = ()) -> None:
        self.log = log
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._stop = asyncio.Event()
        ready: concurrent.futures.Future[ClientSession] = concurrent.futures.Future()
        listed = [arg for name in attach for arg in ("--attach", name)]
        server = StdioServerParameters(
            command=sys.executable, args=["-m", "sandbox_tools.cli", "mcp", *listed], env=env
        )
        self._held = asyncio.run_coroutine_threadsafe(self._hold(server, ready), self._loop)
        self.session = ready.result(timeout=120)

    async def _hold(
        self, server: StdioServerParameters, ready: concurrent.futures.Future[ClientSession]
    ) -> None:
        try:
            with self.log.open("w") as errlog:
                async with (
                    stdio_client(server, errlog=errlog) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    ready.set_result(session)
                    await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    def run(self, coroutine: Any, timeout: float = CALL_TIMEOUT) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def call(self, tool: str, **arguments: Any) -> CallToolResult:
        result: CallToolResult = self.run(self.session.call_tool(tool, arguments))
        return result

    def ok(self, tool: str, **arguments: Any) -> CallToolResult:
        result = self.call(tool, **arguments)
        assert not result.isError, text(result)
        return result

    def close(self) -> None:
        """Close the client (the server's stdin), wait for the SDK's shutdown of it."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._held.result(timeout=60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


def text(result: CallToolResult) -> str:
    """The answer's text (a screenshot's image follows it)."""
    content = result.content[0]
    assert isinstance(content, TextContent)
    return content.text


@pytest.fixture(scope="module")
def images(docker_engine: Any) -> dict[str, str]:
    arch = arches_under_test()[0]
    return {
        target: ensure_target_image(docker_engine, target, arch)
        for target in ("debian-12", "busybox")
    }


@pytest.fixture(scope="module")
def gateway_env(browser_dist: Path) -> dict[str, str]:
    """The gateway's environment: this session's runtime and browser add-on builds."""
    env = {**os.environ, "PYTHONPATH": SRC, "SANDBOX_TOOLS_DIST": str(browser_dist)}
    env.pop("SANDBOX_TOOLS_KEEP_CONTAINERS", None)
    return env


@pytest.fixture(scope="module")
def gateway(gateway_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    held = Gateway(
        gateway_env, tmp_path_factory.mktemp("gateway") / "stderr.log", (MISSING, STOPPED)
    )
    yield held
    held.close()


@pytest.fixture(scope="module")
def debian(gateway: Gateway, images: dict[str, str], docker_engine: Any) -> str:
    """A Debian sandbox as root, as the image runs (network none by default)."""
    made = gateway.ok("sandbox_create", image=images["debian-12"])
    assert made.structuredContent is not None
    # Its disk is bounded where the engine's storage driver can, and the answer says so
    # where it cannot.
    container = docker_engine.containers.get(made.structuredContent["container"])
    bounded = (container.attrs["HostConfig"].get("StorageOpt") or {}).get("size") == "10g"
    assert bounded != ("Its disk is not bounded" in text(made)), text(made)
    return str(made.structuredContent["sandbox"])


@pytest.fixture(scope="module")
def busybox(gateway: Gateway, images: dict[str, str]) -> str:
    """A static busybox and nothing else: uid 1000, read-only root, no network."""
    made = gateway.ok(
        "sandbox_create",
        image=images["busybox"],
        user="1000:1000",
        read_only=True,
        tmpfs={"/tmp": "exec,size=256m"},
        environment={"HOME": "/tmp"},
        network_mode="none",
        pids_limit=256,
        mem_limit="512m",
    )
    assert "read-only root" in text(made) and "uid 1000" in text(made)
    assert made.structuredContent is not None
    return str(made.structuredContent["sandbox"])


def test_the_tools_and_their_schemas_are_listed(gateway: Gateway) -> None:
    tools = {tool.name: tool for tool in gateway.run(gateway.session.list_tools()).tools}
    assert set(tools) == {
        "sandbox_create",
        "sandbox_attach",
        "sandbox_list",
        "sandbox_close",
        "bash",
        "text_editor",
        "exec_start",
        "exec_poll",
        "exec_kill",
        *(tool.name for tool in RUNTIME_BROWSER_TOOLS),
    }
    bash = tools["bash"].inputSchema
    assert bash["required"] == ["sandbox"]
    assert bash["properties"]["wait_for_output"]["maximum"] == MAX_WAIT_S
    assert "session_name" not in bash["properties"]  # the gateway's to fill
    assert all(rule["description"] for rule in bash["properties"].values())


def test_a_debian_sandbox_is_a_persistent_shell_as_root(
    gateway: Gateway, debian: str, docker_engine: Any
) -> None:
    listed = gateway.ok("sandbox_list").structuredContent
    assert listed is not None
    (mine,) = [each for each in listed["sandboxes"] if each["sandbox"] == debian]
    assert mine["made_here"] and mine["status"] == "running"
    container = docker_engine.containers.get(mine["container"])
    assert container.labels[MCP_GATEWAY_LABEL] == debian
    # Bounds it was not asked for: memory, processes, CPUs and its log.
    host = container.attrs["HostConfig"]
    assert host["Memory"] == 2 * 1024**3 and host["PidsLimit"] == DEFAULT_PIDS
    assert 0 < host["NanoCpus"] <= DEFAULT_CPUS * 1e9
    assert host["LogConfig"] == {"Type": LOG_CONFIG["type"], "Config": LOG_CONFIG["config"]}
    assert "0" in text(gateway.ok("bash", sandbox=debian, input="cd /tmp && X=42 && id -u\n"))
    assert "42 /tmp" in text(gateway.ok("bash", sandbox=debian, input="echo $X $PWD\n"))
    assert 'PRETTY_NAME="Debian' in text(
        gateway.ok("bash", sandbox=debian, input="cat /etc/os-release\n")
    )


def test_files_are_created_edited_viewed_and_an_edit_undone(gateway: Gateway, debian: str) -> None:
    path = "/root/notes.txt"
    gateway.ok("text_editor", sandbox=debian, command="create", path=path, file_text="one\ntwo\n")
    edited = gateway.ok(
        "text_editor", sandbox=debian, command="str_replace", path=path, old_str="two", new_str="2"
    )
    assert "2" in text(edited)
    gateway.ok(
        "text_editor", sandbox=debian, command="insert", path=path, insert_line=0, new_str="zero"
    )
    viewed = text(
        gateway.ok("text_editor", sandbox=debian, command="view", path=path, view_range=[1, -1])
    )
    assert viewed.endswith("1\tzero\n     2\tone\n     3\t2\n"), viewed
    gateway.ok("text_editor", sandbox=debian, command="undo_edit", path=path)
    assert "zero" not in text(gateway.ok("bash", sandbox=debian, input=f"cat {path}\n"))
    wrong = gateway.call(
        "text_editor", sandbox=debian, command="str_replace", path=path, old_str="nine"
    )
    assert wrong.isError and "did not appear verbatim" in text(wrong)


def poll_to_the_end(gateway: Gateway, sandbox: str, pid: int) -> tuple[str, str, dict[str, Any]]:
    stdout = stderr = ""
    for _ in range(30):
        answer = gateway.ok("exec_poll", sandbox=sandbox, pid=pid, wait_ms=5000)
        said = text(answer)
        stdout += said.partition("--- stdout ---\n")[2].partition("\n--- stderr ---")[0]
        stderr += said.partition("--- stderr ---\n")[2]
        facts = answer.structuredContent
        assert facts is not None
        if facts["state"] != "running" and not facts["waiting"]:
            return stdout, stderr, facts
    raise AssertionError("the job did not end")


def test_a_job_is_polled_to_its_end_and_another_killed(gateway: Gateway, debian: str) -> None:
    started = gateway.ok(
        "exec_start",
        sandbox=debian,
        command='for i in 1 2 3; do echo "out $i $GREETING"; echo "err $i" >&2; sleep 0.2; done; '
        "exit 3",
        env={"GREETING": "hi"},
        cwd="/tmp",
    )
    assert started.structuredContent is not None
    pid = started.structuredContent["pid"]
    stdout, stderr, end = poll_to_the_end(gateway, debian, pid)
    assert stdout.split("\n")[:3] == ["out 1 hi", "out 2 hi", "out 3 hi"]
    assert "err 3" in stderr
    assert end == {
        "sandbox": debian,
        "pid": pid,
        "state": "completed",
        "exit_code": 3,
        "waiting": 0,
    }
    gone = gateway.call("exec_poll", sandbox=debian, pid=pid)
    assert gone.isError and f"has no job with pid {pid}" in text(gone)

    # A client that asks for progress sees each piece of output as it comes.
    ticker = gateway.ok(
        "exec_start", sandbox=debian, command="for i in 1 2 3; do echo tick $i; sleep 0.5; done"
    )
    assert ticker.structuredContent is not None
    heard: list[str] = []

    async def hear(progress: float, total: float | None, message: str | None) -> None:
        heard.append(message or "")

    streamed = gateway.run(
        gateway.session.call_tool(
            "exec_poll",
            {"sandbox": debian, "pid": ticker.structuredContent["pid"], "wait_ms": 20000},
            progress_callback=hear,
        )
    )
    assert not streamed.isError and "completed with exit code 0" in text(streamed)
    assert len(heard) >= 2 and "".join(heard) == "tick 1\ntick 2\ntick 3\n", heard

    sleeper = gateway.ok("exec_start", sandbox=debian, command="echo started; sleep 1000")
    assert sleeper.structuredContent is not None
    pid = sleeper.structuredContent["pid"]
    first = gateway.ok("exec_poll", sandbox=debian, pid=pid, wait_ms=5000)
    assert "started" in text(first) and "is running" in text(first)
    killed = gateway.ok("exec_kill", sandbox=debian, pid=pid)
    assert killed.structuredContent is not None
    assert killed.structuredContent["state"] == "killed", text(killed)


def test_a_busybox_sandbox_runs_as_uid_1000_read_only_without_network(
    gateway: Gateway, busybox: str
) -> None:
    said = text(gateway.ok("bash", sandbox=busybox, input="id -u; touch /x; ls /sys/class/net\n"))
    assert "sh -i" in said  # the runtime's note: no bash in this image
    assert "1000" in said and "Read-only file system" in said
    assert said.split("Read-only file system")[1].split() == ["lo"]
    gateway.ok("text_editor", sandbox=busybox, command="create", path="/tmp/a.txt", file_text="x\n")
    refused = gateway.call(
        "text_editor", sandbox=busybox, command="create", path="/a.txt", file_text="x"
    )
    assert refused.isError
    job = gateway.ok("exec_start", sandbox=busybox, command="cat /tmp/a.txt; id -u")
    assert job.structuredContent is not None
    stdout, _, end = poll_to_the_end(gateway, busybox, job.structuredContent["pid"])
    assert stdout.split() == ["x", "1000"] and end["exit_code"] == 0


@pytest.mark.security
def test_huge_output_reaches_the_client_bounded(gateway: Gateway, busybox: str) -> None:
    """THREAT_MODEL.md rule 3, the MCP gateway: megabytes printed in one line reach the
    client as one answer of the newest 100,000 bytes (the shell) or in answers of 100,000
    characters that say more is waiting (a job), never whole."""
    flood = "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo END\n"
    said = text(gateway.ok("bash", sandbox=busybox, input=flood, wait_for_output=120))
    assert len(said) <= ANSWER_CHARS and "\nEND\n" in said  # the newest output is kept
    assert "bytes of earlier output truncated" in said
    job = gateway.ok(
        "exec_start", sandbox=busybox, command="head -c 8000000 /dev/zero | tr '\\0' b"
    )
    assert job.structuredContent is not None
    pid = job.structuredContent["pid"]
    said_more = False
    for _ in range(20):  # the first polls may bring less than an answer holds
        answer = text(gateway.ok("exec_poll", sandbox=busybox, pid=pid, wait_ms=10000))
        stdout = answer.partition("--- stdout ---\n")[2]
        assert len(answer) <= ANSWER_CHARS and stdout.count("b") <= RESULT_CHARS
        if "call exec_poll again" in answer:
            said_more = True
            break
    assert said_more, "no answer said that more output was waiting"
    gateway.ok("exec_kill", sandbox=busybox, pid=pid)  # its output unread: the kill still ends it


def debian_container(gateway: Gateway) -> str:
    """The name of a container on the engine the module's gateway was not told of."""
    listed = gateway.ok("sandbox_list").structuredContent
    assert listed is not None and listed["sandboxes"]
    return str(listed["sandboxes"][0]["container"])


def test_what_a_client_gets_wrong_is_an_error_result_it_can_act_on(
    gateway: Gateway, debian: str, docker_engine: Any, images: dict[str, str]
) -> None:
    unknown = gateway.call("bash", sandbox="sbx-00000000", input="ls\n")
    assert unknown.isError and "there is no sandbox 'sbx-00000000'" in text(unknown)
    missing = gateway.call("sandbox_attach", container=MISSING)
    assert missing.isError and f"no container {MISSING!r} on the Docker engine" in text(missing)
    unlisted = gateway.call("sandbox_attach", container=debian_container(gateway))
    assert unlisted.isError and "not one this server may attach to" in text(unlisted)
    no_image = gateway.call("sandbox_create", image="sandbox-tools-test/never-built:1")
    assert no_image.isError and "not on the Docker engine" in text(no_image)
    bad = gateway.call("exec_start", sandbox="sbx-00000000", command=["ls"])
    assert bad.isError and 'field "command" must be string' in text(bad)
    stopped = docker_engine.containers.create(
        images["busybox"], ["sleep", "infinity"], name=STOPPED
    )
    try:
        refused = gateway.call("sandbox_attach", container=STOPPED)
        assert refused.isError and "not running" in text(refused)
    finally:
        stopped.remove(force=True)
    for result in (unknown, missing, unlisted, no_image, bad, refused):
        assert "Traceback" not in text(result)


def test_sandboxes_are_listed_and_closed(
    gateway: Gateway, debian: str, busybox: str, docker_engine: Any, images: dict[str, str]
) -> None:
    third = gateway.ok("sandbox_create", image=images["busybox"]).structuredContent
    assert third is not None
    listed = gateway.ok("sandbox_list").structuredContent
    assert listed is not None
    assert {debian, busybox, third["sandbox"]} <= {s["sandbox"] for s in listed["sandboxes"]}
    closed = gateway.ok("sandbox_close", sandbox=third["sandbox"])
    assert "removed" in text(closed)
    with pytest.raises(docker.errors.NotFound):
        docker_engine.containers.get(third["container"])
    again = gateway.call("sandbox_close", sandbox=third["sandbox"])
    assert again.isError and "there is no sandbox" in text(again)


def test_a_client_that_goes_away_leaves_no_container_it_made_but_the_attached_one_running(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    kept_name = ""
    listed = f"sandbox-tools-test-mcp-named-{os.getpid()}"
    with RunningContainer(docker_engine, images["busybox"], name=listed) as named:
        try:
            client = Gateway(gateway_env, tmp_path / "stderr.log", (listed,))
            try:
                made = client.ok("sandbox_create", image=images["busybox"]).structuredContent
                kept = client.ok("sandbox_create", image=images["busybox"], keep=True)
                assert made is not None and kept.structuredContent is not None
                kept_name = kept.structuredContent["container"]
                attached = client.ok("sandbox_attach", container=named.name).structuredContent
                assert attached is not None and not attached["made_here"]
                client.ok("exec_start", sandbox=attached["sandbox"], command="sleep 4321")
                client.ok("bash", sandbox=attached["sandbox"], input="echo shell\n")
            finally:
                client.close()
            with pytest.raises(docker.errors.NotFound):
                docker_engine.containers.get(made["container"])
            assert docker_engine.containers.get(kept_name).status == "running"
            named.container.reload()
            assert named.container.status == "running"

            def sleeper_gone() -> bool:
                ps = named.container.exec_run(["ps", "-o", "args"]).output.decode()
                return "sleep 4321" not in ps

            eventually(sleeper_gone, "the job the gateway started in the attached container ended")
        finally:
            if kept_name:
                docker_engine.containers.get(kept_name).remove(force=True)
    log = (tmp_path / "stderr.log").read_text()
    assert "the client closed the connection" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_a_signal_while_a_sandbox_is_made_leaves_no_container_behind(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """SIGTERM ends the server as a closed stdin does, even while the client is silent
    and a create is half-way: every container it made is removed (found by the owner
    label, which names the server's pid)."""
    log = tmp_path / "stderr.log"
    server = RawMcpServer(gateway_env, log)
    try:
        server.call(2, "sandbox_create", image=images["busybox"])
        made = server.answer()["result"]
        assert not made["isError"], made
        server.call(3, "sandbox_create", image=images["busybox"])  # answered never
        eventually(
            lambda: (
                len(
                    docker_engine.containers.list(
                        all=True, ignore_removed=True, filters=server.mine()
                    )
                )
                == 2
            ),
            "the second container is being made",
            timeout=60,
        )
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    finally:
        server.end()
    assert docker_engine.containers.list(all=True, ignore_removed=True, filters=server.mine()) == []
    said = log.read_text()
    assert "ended by a signal" in said and "closed 1 sandbox(es)" in said, said[-3000:]


def test_a_cancelled_create_or_close_leaves_no_container_and_no_half_closed_sandbox(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """A client that cancels sandbox_create while the container is made, or sandbox_close
    while it is removed: no container is left that sandbox_list does not show (and the
    bound of 16 does not count), and a closed sandbox is not left "being closed"."""
    server = RawMcpServer(gateway_env, tmp_path / "stderr.log")
    answers: dict[int, dict[str, Any]] = {}

    def answer_to(request_id: int) -> dict[str, Any]:
        while request_id not in answers:  # a cancelled request may have answered first
            answered = server.answer()
            answers[answered["id"]] = answered
        return answers[request_id]

    def listed() -> dict[str, str]:
        server.call(100 + len(answers), "sandbox_list")
        facts = answer_to(100 + len(answers))["result"]["structuredContent"]
        return {each["container"]: each["sandbox"] for each in facts["sandboxes"]}

    def containers() -> set[str]:
        return {
            c.name
            for c in docker_engine.containers.list(
                all=True, ignore_removed=True, filters=server.mine()
            )
        }

    try:
        for request_id, delay in ((2, 0.15), (3, 1.2)):
            server.call(request_id, "sandbox_create", image=images["busybox"])
            time.sleep(delay)
            server.cancel(request_id)
        server.call(4, "sandbox_create", image=images["busybox"])
        closing = answer_to(4)["result"]["structuredContent"]
        server.call(5, "sandbox_close", sandbox=closing["sandbox"])
        time.sleep(0.05)
        server.cancel(5)
        probes = iter(range(300, 400))

        def settled() -> bool:
            """The close went on to its end, or never began; nothing in between."""
            probe = next(probes)
            server.call(probe, "bash", sandbox=closing["sandbox"], input="echo still here\n")
            said = answer_to(probe)["result"]["content"][0]["text"]
            if "is being closed" in said:
                return False
            gone = "there is no sandbox" in said and closing["container"] not in containers()
            return gone or "still here" in said

        eventually(settled, "the cancelled close ended or never began", timeout=60)
        eventually(
            lambda: containers() == set(listed()),
            "every container the server made is one of its listed sandboxes",
            timeout=60,
        )
        for number, sandbox in enumerate(listed().values()):
            server.call(200 + number, "sandbox_close", sandbox=sandbox)
            assert not answer_to(200 + number)["result"]["isError"]
        assert containers() == set() and listed() == {}
    finally:
        server.end()


def test_sixteen_sandboxes_from_one_client_at_once_and_no_more(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """One client makes MAX_SANDBOXES busybox sandboxes at once and runs a command in
    each; the next is refused; the gateway's memory and threads stay bounded meanwhile;
    a kept one, once closed, still counts until it is removed from the engine."""
    client = Gateway(gateway_env, tmp_path / "stderr.log")
    try:

        async def make_and_use() -> str:
            made = await client.session.call_tool("sandbox_create", {"image": images["busybox"]})
            assert not made.isError and made.structuredContent is not None, made
            sandbox = str(made.structuredContent["sandbox"])
            said = await client.session.call_tool(
                "bash", {"sandbox": sandbox, "input": "echo hello-$((6*7))\n"}
            )
            assert "hello-42" in text(said)
            return sandbox

        async def all_at_once() -> list[str]:
            return list(await asyncio.gather(*(make_and_use() for _ in range(MAX_SANDBOXES))))

        sandboxes = client.run(all_at_once(), timeout=600)
        assert len(set(sandboxes)) == MAX_SANDBOXES
        refused = client.call("sandbox_create", image=images["busybox"])
        assert refused.isError and f"holds {MAX_SANDBOXES} sandboxes already" in text(refused)
        pid = _server_pid(client, docker_engine)
        status = Path(f"/proc/{pid}/status").read_text()
        facts = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss_mib = int(facts["VmRSS"].split()[0]) / 1024
        threads = int(facts["Threads"])
        assert rss_mib < 400 and threads < 80, (rss_mib, threads)
        print(f"{MAX_SANDBOXES} sandboxes: gateway RSS {rss_mib:.0f} MiB, {threads} threads")

        # A kept container closed still counts; removed on the engine, it no longer does.
        client.ok("sandbox_close", sandbox=sandboxes[0])
        kept = client.ok("sandbox_create", image=images["busybox"], keep=True).structuredContent
        assert kept is not None
        client.ok("sandbox_close", sandbox=kept["sandbox"])
        assert client.call("sandbox_create", image=images["busybox"]).isError
        docker_engine.containers.get(kept["container"]).remove(force=True)
        client.ok("sandbox_create", image=images["busybox"])
    finally:
        client.close()
    # The SDK's client gives its server 2 s after closing stdin, then SIGTERM, then
    # SIGKILL 2 s later: 16 sandboxes are removed within that.
    left = docker_engine.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{OWNER_LABEL}={pid}"}
    )
    said = (tmp_path / "stderr.log").read_text()
    assert left == [] and "closed 16 sandbox(es)" in said, said[-2000:]


def _server_pid(client: Gateway, engine: Any) -> int:
    """The gateway's pid, from the owner label of a container it made."""
    listed = client.ok("sandbox_list").structuredContent
    assert listed is not None
    owner = engine.containers.get(listed["sandboxes"][0]["container"]).labels[MCP_OWNER_LABEL]
    return int(owner.split("/")[3])  # host/boot id/pid namespace/pid/start time


def test_cleanup_removes_what_a_killed_gateway_left_but_not_the_kept_or_a_lookalike(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """SIGKILL gives a gateway no time to remove its containers; `tools cleanup --mcp`
    removes them afterwards, leaves the one made with keep, and leaves a user's container
    whose image carries the gateway's labels (an image can carry any label)."""
    lookalike_image = f"sandbox-tools-test/mcp-lookalike:{os.getpid()}"
    base = docker_engine.containers.create(images["busybox"], ["true"])
    lookalike = None
    try:
        labels = {MCP_GATEWAY_LABEL: "sbx-00000000", MCP_OWNER_LABEL: "x/1/1"}
        base.commit(
            lookalike_image,
            changes=[f'LABEL {key}="{value}"' for key, value in labels.items()],
        )
        lookalike = docker_engine.containers.run(  # even named as a gateway names them
            lookalike_image,
            ["sleep", "infinity"],
            detach=True,
            name=f"sandbox-tools-mcp-lookalike-{os.getpid()}",
        )
        client = Gateway(gateway_env, tmp_path / "stderr.log")
        made = client.ok("sandbox_create", image=images["busybox"]).structuredContent
        kept = client.ok("sandbox_create", image=images["busybox"], keep=True).structuredContent
        assert made is not None and kept is not None
        os.kill(_server_pid(client, docker_engine), signal.SIGKILL)
        with contextlib.suppress(Exception):  # the server is gone: the client may say so
            client.close()
        assert docker_engine.containers.get(made["container"]).status == "running"
        listed = subprocess.run(
            [sys.executable, "-m", "sandbox_tools.cli", "cleanup", "--mcp", "--dry-run"],
            env=gateway_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert f"{made['container']} ({made['sandbox']}): would be removed" in listed.stdout
        assert docker_engine.containers.get(made["container"]).status == "running"
        cleaned = subprocess.run(
            [sys.executable, "-m", "sandbox_tools.cli", "cleanup", "--mcp"],
            env=gateway_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cleaned.returncode == 0, cleaned.stderr
        said = cleaned.stdout
        assert f"{made['container']} ({made['sandbox']}): removed" in said, said
        assert f"{kept['container']} ({kept['sandbox']}): stays: made with keep" in said, said
        assert "its image carries the gateway's labels" in said, said
        with pytest.raises(docker.errors.NotFound):
            docker_engine.containers.get(made["container"])
        assert docker_engine.containers.get(kept["container"]).status == "running"
        lookalike.reload()
        assert lookalike.status == "running"
        docker_engine.containers.get(kept["container"]).remove(force=True)
    finally:
        if lookalike is not None:
            lookalike.remove(force=True)
        base.remove(force=True)
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_engine.images.remove(lookalike_image, force=True)


def test_inspect_runs_a_react_agent_through_the_gateway(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """A third-party client: inspect_ai's own `mcp_server_stdio` starts the gateway, and
    its `react()` agent (mockllm, answering from what the tools said) makes a sandbox,
    runs a command in it, reads the file it wrote, closes it and submits the result."""
    from inspect_ai import Task, eval
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ChatMessage, ChatMessageTool, ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import includes
    from inspect_ai.tool import mcp_server_stdio

    model = "mockllm/model"

    def said(message: ChatMessage) -> str:
        return message.text if isinstance(message, ChatMessageTool) else ""

    def agent(input: list[ChatMessage], *_: Any) -> ModelOutput:
        """The next call, from the tool answers so far (the sandbox id among them)."""
        answers = [said(m) for m in input if isinstance(m, ChatMessageTool)]
        sandbox = next(
            (word.rstrip(":.") for a in answers for word in a.split() if word.startswith("sbx-")),
            "",
        )
        calls: list[tuple[str, dict[str, Any]]] = [
            ("sandbox_create", {"image": images["busybox"], "user": "1000:1000"}),
            ("bash", {"sandbox": sandbox, "input": "echo $((6*7)) > /tmp/answer; id -u\n"}),
            ("text_editor", {"sandbox": sandbox, "command": "view", "path": "/tmp/answer"}),
            ("sandbox_close", {"sandbox": sandbox}),
        ]
        if len(answers) < len(calls):
            name, arguments = calls[len(answers)]
            output = ModelOutput.for_tool_call(model, name, arguments)
        else:
            viewed = answers[2].split()
            output = ModelOutput.for_tool_call(model, "submit", {"answer": viewed[-1]})
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    server = mcp_server_stdio(
        name="sandbox-tools",
        command=sys.executable,
        args=["-m", "sandbox_tools.cli", "mcp"],
        env=gateway_env,
    )
    task = Task(
        dataset=[Sample(input="Compute 6*7 in a sandbox.", target="42")],
        solver=react(tools=[server]),
        scorer=includes(),
    )
    (log,) = eval(
        task,
        model=get_model(model, custom_outputs=agent),
        log_dir=str(tmp_path / "logs"),
        display="none",
    )
    assert log.status == "success", log.error
    assert log.samples is not None
    (sample,) = log.samples
    assert sample.error is None, sample.error
    answers = [m.text for m in sample.messages if isinstance(m, ChatMessageTool)]
    assert all(not m.error for m in sample.messages if isinstance(m, ChatMessageTool))
    assert "Created sandbox sbx-" in answers[0] and "1000" in answers[1], answers
    assert "removed" in answers[3], answers
    assert sample.scores is not None and next(iter(sample.scores.values())).value == "C"
    made = answers[0].split("container ")[1].split()[0]
    with pytest.raises(docker.errors.NotFound):
        docker_engine.containers.get(made)


PAGE = """<!doctype html><title>Greeter</title>
<h1 id="out">Nobody yet</h1>
<input aria-label="Name" id="name">
<button onclick="document.getElementById('out').textContent =
  'Hello, ' + document.getElementById('name').value">Greet</button>
"""


def element(tree: str, pattern: str) -> int:
    """The id the page tree gives the first element matching `pattern`."""
    import re

    found = re.search(rf"\[(\d+)\] {pattern}", tree)
    assert found, tree
    return int(found.group(1))


def test_the_sandboxes_browser_navigates_types_clicks_and_shows_a_screenshot(
    gateway: Gateway, debian: str
) -> None:
    """The browser tools, relayed to the runtime's browser server in the sandbox (the
    add-on installed by the first call): a page of the sandbox's own files, a field
    typed into, a button clicked, the page changed by it, and a PNG of the viewport."""
    gateway.ok("text_editor", sandbox=debian, command="create", path="/root/p.html", file_text=PAGE)
    page = text(gateway.ok("browser_navigate", sandbox=debian, url="file:///root/p.html"))
    assert "URL: file:///root/p.html" in page and "Nobody yet" in page, page
    field = element(page, 'textbox "Name"')
    gateway.ok("browser_type", sandbox=debian, element_id=field, text="Ada")
    page = text(gateway.ok("browser_snapshot", sandbox=debian))
    after = text(
        gateway.ok("browser_click", sandbox=debian, element_id=element(page, 'button "Greet"'))
    )
    assert "Hello, Ada" in after, after
    shot = gateway.ok("browser_screenshot", sandbox=debian)
    images = [part for part in shot.content if isinstance(part, ImageContent)]
    assert len(images) == 1 and images[0].mimeType == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
    tabs = text(gateway.ok("browser_tabs", sandbox=debian, action="list"))
    assert "Greeter" in tabs, tabs
    missing = gateway.call("browser_click", sandbox=debian, element_id=99999)
    assert missing.isError and "Traceback" not in text(missing)
    offline = gateway.call("browser_navigate", sandbox=debian, url="http://192.0.2.1/")
    assert offline.isError  # network none: nothing outside the sandbox is reached


def test_the_browser_works_in_busybox_as_uid_1000_read_only_without_network(
    gateway: Gateway, images: dict[str, str]
) -> None:
    """The same browser where the image has no libc and the agent is not root: the
    add-on brings its own, unpacked into the sandbox's writable tmpfs."""
    made = gateway.ok(
        "sandbox_create",
        image=images["busybox"],
        user="1000:1000",
        read_only=True,
        tmpfs={"/tmp": "exec,size=1g"},
        environment={"HOME": "/tmp"},
    ).structuredContent
    assert made is not None
    sandbox = made["sandbox"]
    try:
        gateway.ok(
            "text_editor", sandbox=sandbox, command="create", path="/tmp/p.html", file_text=PAGE
        )
        page = text(gateway.ok("browser_navigate", sandbox=sandbox, url="file:///tmp/p.html"))
        assert "Nobody yet" in page, page
        field = element(page, 'textbox "Name"')
        typed = text(
            gateway.ok("browser_type", sandbox=sandbox, element_id=field, text="Bo", submit=True)
        )
        button = element(typed, 'button "Greet"')
        assert "Hello, Bo" in text(gateway.ok("browser_click", sandbox=sandbox, element_id=button))
        ps = text(gateway.ok("bash", sandbox=sandbox, input="ps -o user,args\n"))
        assert "chrom" in ps.lower(), ps  # the browser runs here...
        assert not any(line.startswith("root") for line in ps.splitlines()), ps  # ...not as root
    finally:
        gateway.ok("sandbox_close", sandbox=sandbox)


def test_the_documented_python_client_runs_as_written_offline(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """docs/MCP_GATEWAY.md's Python example, as written, in a fresh interpreter: the
    console script `sandbox-tools` on PATH (here a shim to this checkout) and the
    `busybox:offline` image it names (this session's busybox image, tagged so)."""
    from tests.docs.blocks import ROOT, code_blocks

    (block,) = [
        b
        for b in code_blocks([ROOT / "docs" / "MCP_GATEWAY.md"])
        if b.kind == "python" and "echo hello from uid $(id -u)" in b.source
    ]
    docker_engine.images.get(images["busybox"]).tag("busybox", "offline")
    shims = tmp_path / "bin"
    shims.mkdir()
    shim = shims / "sandbox-tools"
    # An installation with its runtime: the SDK's client gives the server only a few
    # variables of its own (HOME, PATH, ...), so the shim carries this session's build.
    shim.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={SRC} SANDBOX_TOOLS_DIST={gateway_env['SANDBOX_TOOLS_DIST']}\n"
        f'exec {sys.executable} -m sandbox_tools.cli "$@"\n'
    )
    shim.chmod(0o755)
    script = tmp_path / "example.py"
    script.write_text(block.source)
    before = made_by_gateways(docker_engine)
    env = {**gateway_env, "PATH": f"{shims}{os.pathsep}{gateway_env.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hello from uid 1000" in done.stdout, done.stdout
    eventually(
        lambda: made_by_gateways(docker_engine) <= before,
        "the example's container is removed when its client closes",
    )


def made_by_gateways(engine: Any) -> set[str]:
    """The ids of every container on the engine with the gateway's label."""
    return {
        c.id
        for c in engine.containers.list(
            all=True, ignore_removed=True, filters={"label": MCP_GATEWAY_LABEL}
        )
    }


def test_attach_refuses_a_clean_container_that_a_sidecar_joins(
    gateway_env: dict[str, str], images: dict[str, str], docker_engine: Any, tmp_path: Path
) -> None:
    """The fourth attacker walk: nothing is wrong with the listed container itself, but
    another container shares its pid namespace (and could hold the engine's socket):
    root in the listed one reaches the sidecar's files through /proc/<pid>/root."""
    listed = f"sandbox-tools-test-mcp-victim-{os.getpid()}"
    with RunningContainer(docker_engine, images["busybox"], name=listed) as victim:
        joins = {"pid_mode": f"container:{victim.id}"}
        with RunningContainer(docker_engine, images["busybox"], **joins):
            client = Gateway(gateway_env, tmp_path / "stderr.log", (listed,))
            try:
                refused = client.call("sandbox_attach", container=listed)
            finally:
                client.close()
    assert refused.isError, text(refused)
    assert "shares its pid namespace" in text(refused), text(refused)
