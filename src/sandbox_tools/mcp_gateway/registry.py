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
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import docker.errors
from docker import DockerClient

from sandbox_tools.errors import (
    ConfigurationError,
    RefusedToolCall,
    RuntimeTransportError,
    ToolError,
)
from sandbox_tools.injector.addon_copy import addons_on_host, docker_addon_mounts
from sandbox_tools.injector.exec_remote import ExecRemoteOptions, start_exec_remote
from sandbox_tools.injector.inject import Injector, ToolSupport
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.injector.tool_clients import (
    bash_session,
    close_bash_session,
    session_gone,
    start_bash_session,
)
from sandbox_tools.mcp_gateway.browser import SandboxBrowser
from sandbox_tools.mcp_gateway.isolation import (
    Volume,
    as_mapping,
    container_name,
    host_reach,
    joined_by,
)
from sandbox_tools.mcp_gateway.jobs import Job
from sandbox_tools.mcp_gateway.owner import gateway_owner
from sandbox_tools.mcp_gateway.spec import CONTAINER_PREFIX, ContainerSpec
from sandbox_tools.runtime.limits import Limits
from sandbox_tools.runtime.tools.bash_session.tool_types import InteractParams
from sandbox_tools.sandboxes.containers import (
    MCP_GATEWAY_LABEL,
    MCP_KEEP_LABEL,
    MCP_OWNER_LABEL,
    OWNER_LABEL,
    ContainerPolicy,
    RunningContainer,
)
from sandbox_tools.sandboxes.docker import DockerSandbox

log = logging.getLogger(__name__)

# Sandboxes one gateway holds at once (made, attached, and made with keep and still on
# the engine): each costs a container and a runtime server; a client that needs more
# closes (or removes) some first.
MAX_SANDBOXES = 16
# Jobs the host reads at once, per sandbox (the runtime's own bound, kept by the host
# too: a forged runtime keeps none) and over all sandboxes. Each holds at most one
# poll's output on the host (MAX_BATCH_CHARS), so these bound the gateway's memory.
MAX_JOBS_PER_SANDBOX = Limits().max_jobs
MAX_JOBS = 64
# Tool calls that reach sandboxes at once, per sandbox and in all: each may hold one
# answer of the runtime (a frame of up to 64 MiB from a forged one) until it is cut;
# more wait their turn. Per sandbox first, so that a sandbox whose runtime never
# answers holds up its own calls only; the sandbox_* tools wait for neither.
MAX_CALLS_PER_SANDBOX = 8
MAX_CALLS_IN_FLIGHT = 32
# The most output one poll of a job brings: what the runtime sends at most. A larger
# batch comes from a runtime that is not ours, and ends the job (jobs.py).
MAX_BATCH_CHARS = Limits().exec_response_bytes
# How long the engine may take to make and start a container before the call gives up
# (the container, if it comes later, is removed then).
CREATE_TIMEOUT = 120.0
ID_PREFIX = "sbx-"
# Closing what the gateway started in a sandbox (a shell, the connection) is bounded.
CLOSE_TIMEOUT = 10.0
# How long removing a sandbox's container waits for its browser to close first.
BROWSER_CLOSE_TIMEOUT = 2.0
# How long the end waits for containers the engine is still making (each request to the
# engine has its own deadline; this bounds the wait for all of them).
ENTER_TIMEOUT = 60.0


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
    jobs_starting: int = 0  # exec_start calls under way: they count against the bound
    disk_bounded: bool = False  # its writable layer has a size (the engine can do it)
    calls: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(MAX_CALLS_PER_SANDBOX), repr=False
    )
    session: str | None = None  # the one bash session, started by the first bash call
    shell_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    closing: bool = False  # sandbox_close or the disconnection took it: no more calls
    _browser: SandboxBrowser | None = field(default=None, repr=False)

    @property
    def browser(self) -> SandboxBrowser:
        """The sandbox's one browser (its server started by the first browser call)."""
        if self._browser is None:
            self._browser = SandboxBrowser(self.support, self.user)
        return self._browser

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

    async def close_browser(self, timeout: float) -> None:
        if self._browser is not None:
            browser, self._browser = self._browser, None
            await browser.close(timeout)

    async def start_job(self, command: str, options: ExecRemoteOptions) -> Job:
        """A new job (the caller checked the bounds and holds a place for it)."""
        process = await start_exec_remote(self.support.client, command, options)
        job = Job(process, max_batch_chars=MAX_BATCH_CHARS)
        if process.pid in self.jobs:  # only a runtime that is not ours says a pid twice
            await job.close()
            raise RuntimeTransportError(
                f"the runtime in sandbox {self.id} gave pid {process.pid} to a second job "
                "while the first is held: it is not sandbox-tools' runtime; close the sandbox"
            )
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
        await self.close_browser(CLOSE_TIMEOUT)
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
        *,
        attachable: Iterable[str] = (),
        mounts_trusted: Iterable[str] = (),
        ends_with: str = "this client's disconnection",
    ) -> None:
        self._connect = engine
        # What ends the sandboxes besides sandbox_close (as the answers say it): the
        # client's disconnection on stdio, the server's end over HTTP.
        self.ends_with = ends_with
        self._engine: DockerClient | None = None
        self._engine_cpus = 0
        self._disk_bounded: bool | None = None  # asked of the engine at the first create
        self._injector = Injector(injection)
        self._policy = policy
        # The containers sandbox_attach may use: exactly as the user named them when
        # starting the server. Nothing else on the engine is ever looked up.
        # Of those, the ones whose bind mounts and volumes the user trusts with the agent.
        self.mounts_trusted = frozenset(mounts_trusted)
        self.attachable = frozenset(attachable) | self.mounts_trusted
        self._by_id: dict[str, GatewaySandbox] = {}
        self._opening = 0  # creates and attaches under way: they count against the limit
        # Containers made with keep and closed (by id): they stay on the engine, and count
        # against MAX_SANDBOXES until they are gone from it.
        self._kept: set[str] = set()
        # Containers being made, in the engine's threads: a call cancelled or timed out
        # meanwhile leaves its container to be removed when it comes (and to the
        # policy's tracker, emptied at the end).
        self._entering: set[asyncio.Future[Any]] = set()
        self.calls = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)

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
            client = await asyncio.to_thread(self._connect)
            info = await asyncio.to_thread(client.info)
            self._engine_cpus = int(info.get("NCPU") or 1) if isinstance(info, dict) else 1
            self._engine = client
        return self._engine

    def _count(self) -> int:
        return len(self._by_id) + self._opening + len(self._kept)

    async def _reserve(self) -> None:
        if self._count() >= MAX_SANDBOXES and self._kept:
            await self._forget_kept_gone()
        if self._count() >= MAX_SANDBOXES:
            kept = (
                f", {len(self._kept)} of them kept containers it made (each counts until it "
                "is removed: docker rm -f NAME)"
                if self._kept
                else ""
            )
            raise RefusedToolCall(
                f"this server holds {MAX_SANDBOXES} sandboxes already{kept}, the most it keeps "
                "at once; close one with sandbox_close first"
            )
        self._opening += 1

    async def _forget_kept_gone(self) -> None:
        """Kept containers the user removed meanwhile no longer count."""
        client = await self.engine()
        present = await asyncio.to_thread(
            lambda: {
                str(c.id)
                for c in client.containers.list(
                    all=True, sparse=True, filters={"label": MCP_GATEWAY_LABEL}
                )
            }
        )
        self._kept &= present

    async def create(self, spec: ContainerSpec, keep: bool) -> GatewaySandbox:
        """A new container of `spec`, labelled as ours, with the runtime injected; a
        container that cannot be made ready is removed again."""
        spec.check()
        await self._reserve()
        try:
            client = await self.engine()
            await asyncio.to_thread(_image_on_engine, client, spec.image)
            token = secrets.token_hex(4)
            sandbox_id = f"{ID_PREFIX}{token}"
            labels = {MCP_GATEWAY_LABEL: sandbox_id, MCP_OWNER_LABEL: gateway_owner()}
            if keep:
                labels[MCP_KEEP_LABEL] = "1"
            options = spec.run_options(self._engine_cpus)
            if await self._disk_bounds(client, spec.image):
                options["storage_opt"] = {"size": spec.disk_limit}
            # The browser add-on's checked tree, read-only: the first browser call sends
            # nothing (an engine on this host, the add-on here; unpacked once per host).
            mounts = await asyncio.to_thread(
                docker_addon_mounts, client, spec.image, self._injector.options
            )
            if mounts:
                options["mounts"] = mounts
            running = RunningContainer(
                client,
                spec.image,
                policy=self._policy,
                name=f"{CONTAINER_PREFIX}{token}",
                labels=labels,
                **options,
            )
            await self._enter(running, spec.image)
            try:
                support = await self._injector.tool_support(running.sandbox)
            except BaseException:
                await asyncio.shield(asyncio.to_thread(running.__exit__, None, None, None))
                raise
            made = GatewaySandbox(
                sandbox_id,
                running.sandbox,
                support,
                spec.image,
                running,
                keep=keep,
                disk_bounded="storage_opt" in options,
            )
            self._by_id[sandbox_id] = made
            return made
        finally:
            self._opening -= 1

    async def _disk_bounds(self, client: DockerClient, image: str) -> bool:
        """Whether the engine bounds a container's writable layer (`--storage-opt
        size`: overlay2 on xfs with project quotas, btrfs, zfs, devicemapper), asked
        once with a container made and removed unstarted."""
        if self._disk_bounded is None:
            self._disk_bounded = await asyncio.to_thread(_bounds_disk, client, image)
            if not self._disk_bounded:
                log.warning(
                    "this engine's storage driver cannot bound a container's disk "
                    "(--storage-opt size): sandboxes' writable layers are unbounded"
                )
        return self._disk_bounded

    async def _enter(self, running: RunningContainer, image: str) -> None:
        """Make and start the container in the engine's thread, for CREATE_TIMEOUT at
        most; a call that gives up (timed out, or cancelled: the client went away)
        leaves the container to be removed as soon as it is made."""
        entering = asyncio.ensure_future(asyncio.to_thread(running.__enter__))
        self._entering.add(entering)
        entering.add_done_callback(self._entering.discard)
        try:
            await asyncio.wait_for(asyncio.shield(entering), CREATE_TIMEOUT)
        except ConfigurationError as exc:  # made, but it would not start: removed
            raise RefusedToolCall(exc.message) from None
        except docker.errors.DockerException as exc:
            raise RefusedToolCall(
                f"the Docker engine refused a container of {image[:200]}: {_said(exc)}"
            ) from None
        except (TimeoutError, asyncio.CancelledError) as exc:
            entering.add_done_callback(lambda done: _remove_when_made(running, done))
            if isinstance(exc, TimeoutError):
                raise RefusedToolCall(
                    f"the Docker engine did not make a container of {image[:200]} within "
                    f"{CREATE_TIMEOUT:.0f} s; it is removed if it comes later"
                ) from None
            raise

    async def attach(self, container: str, user: str | None) -> tuple[GatewaySandbox, bool]:
        """The running container the client named, with the runtime injected (acting as
        `user` if given); (the sandbox, whether it was attached already). Only a
        container the user listed when starting the server (exactly as listed), and
        never one that reaches the host (`attach_problem`): a model told by what it read
        to attach elsewhere reaches nothing."""
        if container not in self.attachable:
            raise RefusedToolCall(_not_attachable(container, self.attachable))
        for held in self._by_id.values():
            if container in (held.container_name, held.docker.container_id) and (held.user == user):
                return held, True
        await self._reserve()
        try:
            client = await self.engine()
            try:  # a name not on the engine is the library's error, naming it
                sandbox = await asyncio.to_thread(DockerSandbox, container, client)
            except docker.errors.DockerException as exc:
                raise RefusedToolCall(
                    f"cannot look up container {container!r}: {_said(exc)}"
                ) from None
            attrs = sandbox.container.attrs
            volumes = await asyncio.to_thread(_volumes, client, attrs)
            others = await asyncio.to_thread(_other_containers, client, attrs)
            problem = attach_problem(
                container,
                attrs,
                volumes,
                others,
                mounts_trusted=container in self.mounts_trusted,
                resolve=_host_paths(client),
                addon_trees=str(addons_on_host(self._injector.options)[1]),
            )
            if problem is not None:
                raise RefusedToolCall(problem)
            status = str(sandbox.container.status)
            if status != "running":
                raise RefusedToolCall(
                    f"container {container!r} is {status}, not running; ask the user to "
                    f"start it (docker start {container}), then attach again"
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

    async def start_job(
        self, held: GatewaySandbox, command: str, options: ExecRemoteOptions
    ) -> Job:
        """A job in `held`, within the host's own bounds on jobs (a runtime that is not
        ours keeps none)."""
        if len(held.jobs) + held.jobs_starting >= MAX_JOBS_PER_SANDBOX:
            raise RefusedToolCall(
                f"sandbox {held.id} has {MAX_JOBS_PER_SANDBOX} jobs already, the most it "
                "runs at once; exec_kill one, or exec_poll a finished one to its end"
            )
        if sum(len(s.jobs) + s.jobs_starting for s in self._by_id.values()) >= MAX_JOBS:
            raise RefusedToolCall(
                f"this server reads {MAX_JOBS} jobs already over all sandboxes, the most it "
                "holds at once; exec_kill one, or exec_poll a finished one to its end"
            )
        held.jobs_starting += 1
        try:
            return await held.start_job(command, options)
        finally:
            held.jobs_starting -= 1

    async def close(self, sandbox_id: str, keep: bool | None = None) -> tuple[GatewaySandbox, bool]:
        """Forget a sandbox: a container the gateway made removed (first, so a client
        that gives its server little time to end still finds it gone) unless it was made
        with keep (and `keep` is not false), else what the gateway started there ended;
        (it, whether its container was removed). Shielded: a client that cancels the
        call does not leave it half done."""
        closing = self.get(sandbox_id)
        if keep and closing.running is not None and not closing.keep:
            raise RefusedToolCall(
                f"sandbox {sandbox_id} was made without keep, so it is removed when closed; "
                "a container to keep is made with sandbox_create keep=true"
            )
        closing.closing = True
        return await asyncio.shield(self._close(closing, keep))

    async def _close(
        self, closing: GatewaySandbox, keep: bool | None
    ) -> tuple[GatewaySandbox, bool]:
        kept = closing.keep if keep is None else keep
        # The settings' keep-containers (debugging) keeps every container, as elsewhere.
        remove = closing.running is not None and not kept and not self._policy.keep
        # The browser first, while its server still answers (bounded: removal waits at
        # most BROWSER_CLOSE_TIMEOUT for it), so that its end is an end, not a lost channel.
        await closing.close_browser(BROWSER_CLOSE_TIMEOUT)
        if remove:
            await asyncio.to_thread(self._policy.release, closing.docker.container)
        elif closing.running is not None:
            self._policy.tracker.discard(closing.docker.container)  # kept: no longer ours
            self._kept.add(closing.docker.container_id)
        del self._by_id[closing.id]
        await closing.release(self._injector, end_work=not remove)
        return closing, remove

    async def aclose(self) -> None:
        """The client is gone: every sandbox closed as it was made (kept ones stay), then
        the containers still being made, and every other container the gateway made and
        holds no sandbox for (a create cancelled half-way), removed."""
        await asyncio.gather(
            *(self.close(sandbox_id) for sandbox_id in list(self._by_id)),
            return_exceptions=True,
        )
        if self._entering:
            await asyncio.wait(set(self._entering), timeout=ENTER_TIMEOUT)
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


def _remove_when_made(running: RunningContainer, entering: asyncio.Future[Any]) -> None:
    """A container whose create call gave up: removed once the engine made it."""
    if entering.cancelled() or entering.exception() is not None:
        return  # never made, or removed by RunningContainer itself
    with contextlib.suppress(RuntimeError):  # the loop is closing: the tracker has it
        asyncio.get_running_loop().run_in_executor(None, running.__exit__, None, None, None)


def _not_attachable(container: str, attachable: frozenset[str]) -> str:
    """One refusal for every name the user did not list, whether or not a container of
    that name exists: the answer tells nothing about the engine."""
    listed = ", ".join(sorted(attachable)) if attachable else "none"
    return (
        f"container {container[:80]!r} is not one this server may attach to. The user "
        f"lists those when starting it (tools mcp --attach NAME; listed: {listed}); "
        "sandbox_create makes a new container instead"
    )


def _volumes(client: DockerClient, attrs: Any) -> dict[str, Volume]:
    """The named volumes the container mounts, as the engine describes them; one it
    cannot describe is given as not plain, so that it is refused rather than trusted."""
    found: dict[str, Volume] = {}
    for mount in as_mapping(attrs).get("Mounts") or []:
        if not isinstance(mount, dict) or mount.get("Type") != "volume":
            continue
        name = str(mount.get("Name") or "")
        try:
            described = as_mapping(client.volumes.get(name).attrs)
        except docker.errors.DockerException:
            found[name] = Volume("?", {"?": "?"})
            continue
        options = {str(k): str(v) for k, v in as_mapping(described.get("Options")).items()}
        found[name] = Volume(str(described.get("Driver") or "?"), options)
    return found


def _other_containers(client: DockerClient, attrs: Any) -> list[Any]:
    """Every other running container as the engine describes it (a list's summary lacks
    the namespace modes), to find those that share one of this one's namespaces."""
    ours = attrs.get("Id")
    described = []
    for summary in client.api.containers():
        if summary.get("Id") == ours:
            continue
        with contextlib.suppress(docker.errors.NotFound):
            described.append(client.api.inspect_container(summary["Id"]))
    return described


def _host_paths(client: DockerClient) -> Callable[[str], str]:
    """How a mount's source is read: its symbolic links followed where the engine is
    this host's (a Unix socket), as written where it is not."""
    local = str(getattr(client.api, "base_url", "")).startswith("http+docker://")
    return os.path.realpath if local else (lambda path: path)


def attach_problem(
    named: str,
    attrs: Any,
    volumes: Mapping[str, Volume] | None = None,
    others: Sequence[Any] = (),
    *,
    mounts_trusted: bool = False,
    resolve: Callable[[str], str] = lambda path: path,
    addon_trees: str | None = None,
) -> str | None:
    """Why a container the user listed is still not attached to, or None. The name must
    be its exact name or full id (the engine also resolves id prefixes); a container
    that reaches the host (isolation.py), or whose namespaces one of `others` (the
    engine's other running containers) joins, gives whoever acts in it the host or
    that container; another gateway's is that gateway's."""
    attrs = as_mapping(attrs)
    if named not in (container_name(attrs), attrs.get("Id")):
        return (
            f"container {named!r} (one the user listed) is not on the engine under that "
            "exact name or id: start it, or ask the user which container to use"
        )
    labels = as_mapping(as_mapping(attrs.get("Config")).get("Labels"))
    reach = host_reach(
        attrs, volumes, mounts_trusted=mounts_trusted, resolve=resolve, addon_trees=addon_trees
    )
    if reach:
        mounts = (
            "; if its mounts hold only what the agent may read and change, the user can "
            "list it with --attach-with-mounts instead"
            if not mounts_trusted and any("mount" in r or "volume" in r for r in reach)
            else ""
        )
        return (
            f"container {named!r} is not isolated from the host ({'; '.join(reach)}): "
            "whoever acts in it can reach the host, so this server does not attach to it; "
            f"use a container without these, or sandbox_create{mounts}"
        )
    joining = joined_by(str(attrs.get("Id")), container_name(attrs), others)
    if joining:
        return (
            f"container {named!r} is not isolated: {'; '.join(joining)}, so whoever acts "
            "in it reaches that container's processes and what they hold; this server "
            "does not attach to it"
        )
    if MCP_GATEWAY_LABEL in labels:
        return (
            f"container {named!r} was made by an MCP gateway (label {MCP_GATEWAY_LABEL}); "
            "this server attaches only to the user's own containers"
        )
    return None


def _bounds_disk(client: DockerClient, image: str) -> bool:
    try:
        probe = client.containers.create(
            image, ["true"], storage_opt={"size": "1g"}, labels={OWNER_LABEL: str(os.getpid())}
        )
    except docker.errors.APIError:
        return False  # "--storage-opt is supported only for overlay over xfs ...", and kin
    with contextlib.suppress(docker.errors.DockerException):
        probe.remove(force=True)
    return True


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
    image = as_mapping(as_mapping(attrs).get("Config")).get("Image")
    return image if isinstance(image, str) and image else "?"


def _said(exc: docker.errors.DockerException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)[:500]
