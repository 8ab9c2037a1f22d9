"""The sandboxes one gateway holds: containers it made, and containers the user named.

Each gets an id the client passes to every tool. A container the gateway made lives in a
`RunningContainer` (sandboxes/containers.py: made, labelled, removed through the
invocation's `ContainerPolicy`) until `sandbox_close` or the client's disconnection
removes it, unless it is kept. A container the client attached to is the user's: closing
it ends what the gateway started there (its jobs, its shell) and the connection to it,
never the container. No other container is ever touched: a sandbox is only ever reached
through the id the gateway gave it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import docker.errors
from docker import DockerClient

from sandbox_tools.errors import ConfigurationError, RefusedToolCall, ToolError
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, start_exec_remote
from sandbox_tools.injector.inject import Injector, ToolSupport
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.tool_clients import (
    bash_session,
    close_bash_session,
    session_gone,
    start_bash_session,
)
from sandbox_tools.mcp_gateway.jobs import Job
from sandbox_tools.runtime.tools.bash_session.tool_types import InteractParams
from sandbox_tools.sandboxes.containers import (
    MCP_GATEWAY_LABEL,
    ContainerPolicy,
    RunningContainer,
)
from sandbox_tools.sandboxes.docker import DockerSandbox

log = logging.getLogger(__name__)

# Sandboxes one gateway holds at once (made and attached): each costs a container and
# a runtime server; a client that needs more closes some first.
MAX_SANDBOXES = 16
ID_PREFIX = "sbx-"
CONTAINER_PREFIX = "sandbox-tools-mcp-"
# Closing what the gateway started in a sandbox (a shell, the connection) is bounded.
CLOSE_TIMEOUT = 10.0
# How long the end waits for containers the engine is still making (each request to the
# engine has its own deadline; this bounds the wait for all of them).
ENTER_TIMEOUT = 60.0


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """How sandbox_create makes a container: the fields of the inspect `docker_sdk`
    sandbox's config (DockerSdkConfig) a client may choose, as `docker run` options."""

    image: str
    user: str | None = None
    read_only: bool = False
    tmpfs: dict[str, str] | None = None
    network_mode: str = "none"
    working_dir: str | None = None
    environment: dict[str, str] | None = None
    mem_limit: str | None = None
    pids_limit: int | None = None

    def run_options(self) -> dict[str, Any]:
        """The docker SDK's `containers.create` options (the image and command aside)."""
        options: dict[str, Any] = {
            "network_mode": self.network_mode,
            "read_only": self.read_only,
            "environment": dict(self.environment or {}),
            "init": True,  # reaps orphans: what the agent leaves behind does not pile up
        }
        tmpfs = self.tmpfs
        if self.read_only and not tmpfs:
            # The runtime needs a writable place that allows execution to live in.
            tmpfs = {"/tmp": "exec"}
        if tmpfs:
            options["tmpfs"] = dict(tmpfs)
        for name in ("user", "working_dir", "mem_limit", "pids_limit"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options


@dataclass(eq=False)
class GatewaySandbox:
    """One sandbox: its container, the runtime in it, and what the client started there."""

    id: str
    docker: DockerSandbox
    support: ToolSupport
    image: str
    running: RunningContainer | None  # the container this gateway made; None: attached
    keep: bool = False  # made, and left running when closed (unless close says otherwise)
    user: str | None = None  # attached as this user (the runtime runs as it)
    jobs: dict[int, Job] = field(default_factory=dict)
    session: str | None = None  # the one bash session, started by the first bash call
    shell_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    closing: bool = False  # sandbox_close or the disconnection took it: no more calls

    @property
    def made(self) -> bool:
        return self.running is not None

    @property
    def container_name(self) -> str:
        return str(self.docker.container.name)

    async def type_into_shell(self, params: InteractParams) -> str:
        """One bash call on the sandbox's shell (started by the first call; a shell that
        is gone, its server restarted, goes on in a new one, and the answer says so).
        One call at a time: each answer is what that call typed brought."""
        async with self.shell_lock:
            said = ""
            if self.session is None:
                said = await self._new_shell()
            try:
                return said + await self._interact(params)
            except ToolError as exc:
                if not session_gone(exc):
                    raise
            said = "[sandbox-tools: the previous shell is gone; this is a new one]\n"
            return said + await self._new_shell() + await self._interact(params)

    async def _new_shell(self) -> str:
        self.session, note = await start_bash_session(self.support.client)
        return f"[sandbox-tools: {note}]\n" if note else ""

    async def _interact(self, params: InteractParams) -> str:
        assert self.session is not None
        return await bash_session(
            self.support.client,
            self.session,
            params.input,
            wait_for_output=params.wait_for_output,
            idle_timeout=params.idle_timeout,
            max_output_bytes=params.max_output_bytes,
            restart=params.restart,
        )

    async def start_job(self, command: str, options: ExecRemoteOptions) -> Job:
        job = Job(await start_exec_remote(self.support.client, command, options))
        self.jobs[job.pid] = job
        return job

    def job(self, pid: int) -> Job:
        found = self.jobs.get(pid)
        if found is None:
            known = ", ".join(map(str, self.jobs)) or "none"
            raise RefusedToolCall(
                f"sandbox {self.id} has no job with pid {pid} (its jobs: {known}); a job is "
                "known from exec_start until exec_poll or exec_kill has shown its end"
            )
        return found

    def forget_if_done(self, job: Job) -> None:
        if job.done:
            self.jobs.pop(job.pid, None)

    async def release(self, injector: Injector, *, end_work: bool = True) -> None:
        """End what the gateway started here (jobs killed, the shell closed: `end_work`;
        not needed once the container is gone) and the connection to the runtime; the
        container itself is the caller's to remove."""
        await asyncio.gather(*(job.close(kill=end_work) for job in self.jobs.values()))
        self.jobs.clear()
        if self.session is not None and end_work:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    close_bash_session(self.support.client, self.session), CLOSE_TIMEOUT
                )
        self.session = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(injector.forget(self.docker), CLOSE_TIMEOUT)


class Sandboxes:
    """Every sandbox of one gateway, by id, with the means to make and attach more."""

    def __init__(
        self,
        engine: Callable[[], DockerClient],
        injection: InjectionOptions,
        policy: ContainerPolicy,
    ) -> None:
        self._connect = engine
        self._engine: DockerClient | None = None
        self._injector = Injector(injection)
        self._policy = policy
        self._by_id: dict[str, GatewaySandbox] = {}
        self._opening = 0  # creates and attaches under way: they count against the limit
        # Containers being made, in the engine's threads: a call cancelled meanwhile (the
        # client went away) leaves its container to the policy's tracker, emptied at the end.
        self._entering: set[asyncio.Future[Any]] = set()

    def held(self) -> list[GatewaySandbox]:
        """Every sandbox, in the order they were made or attached."""
        return list(self._by_id.values())

    def get(self, sandbox_id: str) -> GatewaySandbox:
        found = self._by_id.get(sandbox_id)
        if found is not None and found.closing:
            raise RefusedToolCall(f"sandbox {sandbox_id} is being closed")
        if found is None:
            known = ", ".join(self._by_id) or "none yet"
            raise RefusedToolCall(
                f"there is no sandbox {sandbox_id[:80]!r} (this server's sandboxes: {known}); "
                "pass an id that sandbox_create or sandbox_attach gave"
            )
        return found

    async def engine(self) -> DockerClient:
        """The Docker engine, connected at the first call that needs it: the server
        answers initialize and tools/list without one."""
        if self._engine is None:
            self._engine = await asyncio.to_thread(self._connect)
        return self._engine

    def _reserve(self) -> None:
        if len(self._by_id) + self._opening >= MAX_SANDBOXES:
            raise RefusedToolCall(
                f"this server holds {MAX_SANDBOXES} sandboxes already, the most it keeps at "
                "once; close one with sandbox_close first"
            )
        self._opening += 1

    async def create(self, spec: ContainerSpec, keep: bool) -> GatewaySandbox:
        """A new container of `spec`, labelled as ours, with the runtime injected; a
        container that cannot be made ready is removed again."""
        self._reserve()
        try:
            client = await self.engine()
            await asyncio.to_thread(_image_on_engine, client, spec.image)
            token = secrets.token_hex(4)
            sandbox_id = f"{ID_PREFIX}{token}"
            running = RunningContainer(
                client,
                spec.image,
                policy=self._policy,
                name=f"{CONTAINER_PREFIX}{token}",
                labels={MCP_GATEWAY_LABEL: sandbox_id},
                **spec.run_options(),
            )
            entering = asyncio.ensure_future(asyncio.to_thread(running.__enter__))
            self._entering.add(entering)
            entering.add_done_callback(self._entering.discard)
            try:
                await asyncio.shield(entering)  # made whatever becomes of this call
            except ConfigurationError as exc:  # made, but it would not start: removed
                raise RefusedToolCall(exc.message) from None
            except docker.errors.DockerException as exc:
                raise RefusedToolCall(
                    f"the Docker engine refused a container of {spec.image}: {_said(exc)}"
                ) from None
            try:
                support = await self._injector.tool_support(running.sandbox)
            except BaseException:
                await asyncio.to_thread(running.__exit__, None, None, None)
                raise
            made = GatewaySandbox(
                sandbox_id, running.sandbox, support, spec.image, running, keep=keep
            )
            self._by_id[sandbox_id] = made
            return made
        finally:
            self._opening -= 1

    async def attach(self, container: str, user: str | None) -> tuple[GatewaySandbox, bool]:
        """The running container the client named, with the runtime injected (acting as
        `user` if given); (the sandbox, whether it was attached already)."""
        for held in self._by_id.values():
            if container in (held.container_name, held.docker.container_id) and (held.user == user):
                return held, True
        if not container.strip():
            raise RefusedToolCall("name the container to attach to: its name or id")
        self._reserve()
        try:
            client = await self.engine()
            try:
                sandbox = await asyncio.to_thread(DockerSandbox, container, client)
            except docker.errors.DockerException as exc:
                raise RefusedToolCall(
                    f"cannot look up container {container[:200]!r}: {_said(exc)}"
                ) from None
            status = str(sandbox.container.status)
            if status != "running":
                raise RefusedToolCall(
                    f"container {container[:200]!r} is {status}, not running; start it "
                    f"(docker start {sandbox.container.name}) and attach again"
                )
            support = await self._injector.tool_support(sandbox, user)
            image = _image_named(sandbox.container.attrs)
            attached = GatewaySandbox(
                f"{ID_PREFIX}{secrets.token_hex(4)}", sandbox, support, image, None, user=user
            )
            self._by_id[attached.id] = attached
            return attached, False
        finally:
            self._opening -= 1

    async def close(self, sandbox_id: str, keep: bool | None = None) -> tuple[GatewaySandbox, bool]:
        """Forget a sandbox: a container the gateway made removed (first, so a client
        that gives its server little time to end still finds it gone) unless kept
        (`keep`, default: as it was made), else what the gateway started there ended;
        (it, whether its container was removed). A container whose removal failed stays
        listed (closing), for `remove_left_behind` to try again."""
        closing = self.get(sandbox_id)
        closing.closing = True
        kept = keep if keep is not None else closing.keep
        # The settings' keep-containers (debugging) keeps every container, as elsewhere.
        remove = closing.running is not None and not kept and not self._policy.keep
        if remove:
            await asyncio.to_thread(self._policy.release, closing.docker.container)
        elif closing.running is not None:
            self._policy.tracker.discard(closing.docker.container)  # kept: no longer ours
        del self._by_id[sandbox_id]
        await closing.release(self._injector, end_work=not remove)
        return closing, remove

    async def aclose(self) -> None:
        """The client is gone: every sandbox closed as it was made (kept ones stay), then
        every other container the gateway made and holds no sandbox for (a create the
        client's going away cancelled half-way) removed."""
        if self._entering:
            await asyncio.wait(set(self._entering), timeout=ENTER_TIMEOUT)
        await asyncio.gather(
            *(self.close(sandbox_id) for sandbox_id in list(self._by_id)),
            return_exceptions=True,
        )
        await self._injector.aclose()
        if not self._policy.keep:
            await asyncio.to_thread(self._policy.tracker.remove_all)

    def remove_left_behind(self) -> int:
        """Last resort, outside any event loop (the loop died, or a close failed): remove
        every container this gateway made and was not told to keep; how many."""
        if self._policy.keep:
            return 0
        for held in self._by_id.values():
            if held.running is not None and held.keep:
                self._policy.tracker.discard(held.docker.container)
        self._by_id.clear()
        return self._policy.tracker.remove_all()


def _image_on_engine(client: DockerClient, image: str) -> None:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise RefusedToolCall(
            f"image {image[:200]!r} is not on the Docker engine; this server never pulls: "
            "name an image `docker images` lists, or ask the user to pull or build it"
        ) from None
    except docker.errors.APIError as exc:
        raise RefusedToolCall(f"cannot look up image {image[:200]!r}: {_said(exc)}") from None


def _image_named(attrs: Any) -> str:
    """The image a container was made from, as it was named, from the engine's answer
    already in hand (the SDK's `container.image` asks the engine again, blocking)."""
    config = attrs.get("Config") if isinstance(attrs, dict) else None
    image = config.get("Image") if isinstance(config, dict) else None
    return image if isinstance(image, str) and image else "?"


def _said(exc: docker.errors.DockerException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)[:500]
