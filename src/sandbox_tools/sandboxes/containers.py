"""Containers that exist exactly as long as the code using them: create, always remove.

Used by build, validate, `exec-remote`, the tests and the benchmarks. What happens around
every container is a `ContainerPolicy` the caller passes in (the CLI makes one per
invocation from its settings): keep containers for debugging, echo each as a replayable
`+ docker ...` line, and track it in the invocation's `ContainerTracker`, so Ctrl-C
removes what is still running. Every container is also labelled with the process that
made it (`OWNER_LABEL`), so what a killed run left behind is findable; the MCP gateway's
also carry `MCP_GATEWAY_LABEL`.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import docker.errors
from docker import DockerClient
from docker.models.containers import Container

from sandbox_tools.errors import ConfigurationError
from sandbox_tools.settings import Settings, load_settings

if TYPE_CHECKING:
    from sandbox_tools.sandboxes.docker import DockerSandbox

OWNER_LABEL = "sandbox-tools.owner-pid"
# A container the MCP gateway (`tools mcp`) made, valued by the sandbox id it gave the
# client: the gateway removes only containers it made (or was told to keep), and what a
# killed gateway left behind is findable by this label.
MCP_GATEWAY_LABEL = "sandbox-tools.mcp-gateway"
# The gateway process that made it (mcp_gateway/owner.py), and whether it was made to be
# kept after its gateway ends: what `tools cleanup --mcp` reads.
MCP_OWNER_LABEL = "sandbox-tools.mcp-gateway.owner"
MCP_KEEP_LABEL = "sandbox-tools.mcp-gateway.keep"


class ContainerTracker:
    """The containers one invocation made and has not removed yet. A build or validate
    interrupted with Ctrl-C removes them from the main thread, which also ends the
    worker threads waiting on them."""

    def __init__(self) -> None:
        self._live: set[Container] = set()
        self._lock = threading.Lock()

    def add(self, container: Container) -> None:
        with self._lock:
            self._live.add(container)

    def discard(self, container: Container) -> None:
        with self._lock:
            self._live.discard(container)

    def remove_all(self) -> int:
        """Remove every container still tracked; how many."""
        with self._lock:
            live = list(self._live)
            self._live.clear()
        for container in live:
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
        return len(live)


@dataclass(frozen=True)
class ContainerPolicy:
    """What happens around each container of one invocation (see the module's text)."""

    keep: bool = False
    echo: Callable[[str], None] | None = None
    tracker: ContainerTracker = field(default_factory=ContainerTracker)

    @classmethod
    def of(cls, where: Settings, echo: Callable[[str], None] | None = None) -> ContainerPolicy:
        return cls(keep=where.keep_containers, echo=echo)

    @classmethod
    def from_cascade(cls) -> ContainerPolicy:
        """For library entry points called without a policy: the settings as they stand."""
        return cls.of(load_settings())

    def show(
        self, action: str, image: str, command: list[str] | None, options: Mapping[str, Any]
    ) -> None:
        if self.echo is None:
            return
        shown = {k: v for k, v in options.items() if k not in ("labels", "detach") and v}
        flags = " ".join(f"--{k.replace('_', '-')}={v}" for k, v in sorted(shown.items()))
        argv = " ".join(command or [])
        self.echo(f"+ docker {action} {flags} {image} {argv}".replace("  ", " ").rstrip())

    def made(self, container: Container) -> None:
        self.tracker.add(container)

    def release(self, container: Container) -> None:
        """The end of every container of ours: untracked, and removed unless kept."""
        self.tracker.discard(container)
        if self.echo is not None:
            self.echo(f"+ docker rm -f {container.short_id}")
        if not self.keep:
            with contextlib.suppress(docker.errors.NotFound):
                # v: the anonymous volumes an image's VOLUME made go with it.
                container.remove(force=True, v=True)


def _owned(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Label a container with the process that made it: what it left behind is findable."""
    labels = dict(kwargs.pop("labels", None) or {})
    labels.setdefault(OWNER_LABEL, str(os.getpid()))
    return {**kwargs, "labels": labels}


class RunningContainer:
    """A container that exists exactly as long as the `with` block: started on enter,
    removed on exit (error and Ctrl-C included) unless the policy keeps it.

    `.container` is the engine's object, `.sandbox` our `Sandbox` over it (one per
    container, so its engine limit and state are shared by every use)."""

    def __init__(
        self,
        client: DockerClient,
        image: str,
        *,
        command: list[str] | None = None,
        policy: ContainerPolicy | None = None,
        **options: Any,
    ) -> None:
        self.client = client
        self.image = image
        self.command = command or ["sleep", "infinity"]
        self.policy = policy if policy is not None else ContainerPolicy.from_cascade()
        self.options = options
        self._container: Container | None = None
        self._sandbox: DockerSandbox | None = None
        self._id = self._name = ""

    def __enter__(self) -> RunningContainer:
        self.policy.show("run -d", self.image, self.command, self.options)
        # Made, then started: a container the engine cannot start (an image without the
        # `sleep` that keeps it running) is removed, never left behind in "Created".
        container = self.client.containers.create(
            self.image, command=self.command, **_owned(dict(self.options))
        )
        self.policy.made(container)
        try:
            container.start()
        except docker.errors.APIError as exc:
            self.policy.release(container)
            raise ConfigurationError(
                f"cannot start a container of {self.image} with "
                f"{' '.join(self.command)}: {exc.explanation or exc}",
                remedy="The container is kept running by that command: use an image that "
                "has it (a libc-free busybox image has `sleep`), or give another.",
            ) from None
        container.reload()
        self._container = container
        self._id, self._name = str(container.id), str(container.name)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._container is not None:
            container, self._container = self._container, None
            self.policy.release(container)

    @property
    def container(self) -> Container:
        if self._container is None:
            raise RuntimeError("the container exists only inside its `with` block")
        return self._container

    @property
    def id(self) -> str:
        """The container's id, also after the block (for reports)."""
        if not self._id:
            raise RuntimeError("the container is made when its `with` block starts")
        return self._id

    @property
    def name(self) -> str:
        """The container's name, also after the block (for reports)."""
        if not self._name:
            raise RuntimeError("the container is made when its `with` block starts")
        return self._name

    @property
    def sandbox(self) -> DockerSandbox:
        if self._sandbox is None:
            from sandbox_tools.sandboxes.docker import DockerSandbox

            self._sandbox = DockerSandbox(self.container, self.client)
        return self._sandbox

    def copy_in(self, files: Mapping[str, Path]) -> None:
        """Host files or trees at their container paths (by copy: the engine may be remote)."""
        self.container.put_archive("/", _archive_of(files))

    def copy_out(self, path: str, destination: Path) -> None:
        """The contents of the container's directory `path` into `destination`."""
        chunks, _ = self.container.get_archive(path)
        _extract_into(chunks, destination)

    def logs(self) -> str:
        return bytes(self.container.logs()).decode(errors="replace")


def _archive_of(copy_in: Mapping[str, Path]) -> bytes:
    """One tar, rooted at /, with each host file or tree at its container path."""
    skip = {"__pycache__", ".mypy_cache", ".ruff_cache"}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for target, source in copy_in.items():
            tar.add(
                source,
                arcname=target.strip("/"),
                filter=lambda info: None if skip & set(info.name.split("/")) else info,
            )
    return archive.getvalue()


def _extract_into(chunks: Iterator[bytes], destination: Path) -> None:
    """Unpack a `get_archive` stream of a directory into `destination` (its contents)."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            if not inner:
                continue  # the directory itself
            member.name = inner
            members.append(member)
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(destination, members=members, filter="tar")
        else:  # Python before the extraction filters: names were rebased above
            tar.extractall(destination, members=members)


def run_to_completion(
    client: DockerClient,
    image: str,
    command: list[str],
    on_line: Callable[[str], None] = lambda _: None,
    copy_in: Mapping[str, Path] | None = None,
    copy_out: tuple[str, Path] | None = None,
    *,
    policy: ContainerPolicy | None = None,
    **kwargs: Any,
) -> tuple[int, str]:
    """Run `command` in a fresh container; stream its output lines; always remove it.

    Files travel by copy (`copy_in` before the start, `copy_out` after the exit), not by
    bind mounts, so the engine may be on another machine.
    """
    policy = policy if policy is not None else ContainerPolicy.from_cascade()
    policy.show("create", image, command, kwargs)
    container = client.containers.create(image, command=command, **_owned(kwargs))
    policy.made(container)
    lines: list[str] = []
    try:
        if copy_in:
            container.put_archive("/", _archive_of(copy_in))
        container.start()
        pending = ""
        for chunk in container.logs(stream=True, follow=True):
            pending += chunk.decode(errors="replace")
            *complete, pending = pending.split("\n")
            for line in complete:
                lines.append(line)
                on_line(line)
        if pending:
            lines.append(pending)
            on_line(pending)
        status = container.wait()
        if copy_out is not None:
            chunks, _ = container.get_archive(copy_out[0])
            _extract_into(chunks, copy_out[1])
    finally:
        policy.release(container)
    return int(status.get("StatusCode", 1)), "\n".join(lines)
