"""Containers that exist exactly as long as the code using them: create, always remove.

Used by build, validate, `exec-remote`, the tests and the benchmarks. Every container is
labelled with the process that made it (`OWNER_LABEL`), so what an interrupted run left
behind is findable, and tracked until removed, so Ctrl-C removes what is still running
(`remove_live_containers`). `SANDBOX_TOOLS_KEEP_CONTAINERS=1` keeps them for debugging.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import docker.errors
from docker import DockerClient
from docker.models.containers import Container

from sandbox_tools import settings

# Containers made by running_container/run_to_completion and not yet removed: a build or
# validate interrupted with Ctrl-C removes them from the main thread, which also ends the
# worker threads waiting on them.
_LIVE: set[Any] = set()
_LIVE_LOCK = threading.Lock()


OWNER_LABEL = "sandbox-tools.owner-pid"


def _owned(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Label a container with the process that made it: what it left behind is findable."""
    labels = dict(kwargs.pop("labels", None) or {})
    labels.setdefault(OWNER_LABEL, str(os.getpid()))
    return {**kwargs, "labels": labels}


def _track(container: Container) -> None:
    with _LIVE_LOCK:
        _LIVE.add(container)


def remove_live_containers() -> int:
    """Remove every container this process started and still runs; how many."""
    with _LIVE_LOCK:
        live = list(_LIVE)
        _LIVE.clear()
    for container in live:
        with contextlib.suppress(Exception):
            container.remove(force=True)
    return len(live)


# Where to echo each container operation (`tools --verbose`): like cibuildwheel's
# "+ docker ..." lines, so a failing build or cell can be replayed by hand.
_ECHO: list[Callable[[str], None]] = []


def echo_to(show: Callable[[str], None] | None) -> None:
    """Echo container operations to `show` (None: stop)."""
    _ECHO[:] = [show] if show is not None else []


def _echo(action: str, image: str, command: list[str] | None, options: Mapping[str, Any]) -> None:
    if not _ECHO:
        return
    shown = {k: v for k, v in options.items() if k not in ("labels", "detach") and v}
    flags = " ".join(f"--{k.replace('_', '-')}={v}" for k, v in sorted(shown.items()))
    argv = " ".join(command or [])
    _ECHO[0](f"+ docker {action} {flags} {image} {argv}".replace("  ", " ").rstrip())


def _release(container: Container) -> None:
    """The end of every container of ours: untracked, and removed unless kept."""
    with _LIVE_LOCK:
        _LIVE.discard(container)
    if _ECHO:
        _ECHO[0](f"+ docker rm -f {container.short_id}")
    if not settings.current().keep_containers:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


@contextlib.contextmanager
def running_container(
    client: DockerClient, image: str, *, command: list[str] | None = None, **kwargs: Any
) -> Iterator[Any]:
    """A container that exists exactly as long as the `with` block.

    Removed on exit even on error or Ctrl-C; set SANDBOX_TOOLS_KEEP_CONTAINERS=1
    to keep it for debugging.
    """
    argv = command or ["sleep", "infinity"]
    _echo("run -d", image, argv, kwargs)
    container = client.containers.run(image, command=argv, detach=True, **_owned(kwargs))
    _track(container)
    try:
        yield container
    finally:
        _release(container)


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
    **kwargs: Any,
) -> tuple[int, str]:
    """Run `command` in a fresh container; stream its output lines; always remove it.

    Files travel by copy (`copy_in` before the start, `copy_out` after the exit), not by
    bind mounts, so the engine may be on another machine.
    """
    _echo("create", image, command, kwargs)
    container = client.containers.create(image, command=command, **_owned(kwargs))
    _track(container)
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
        _release(container)
    return int(status.get("StatusCode", 1)), "\n".join(lines)
