"""`tools cleanup --mcp`: the containers gateways made and left behind when killed.

A gateway removes what it made when its client goes away, on SIGTERM and SIGHUP, and
when its loop dies; a SIGKILL (a client that gives up waiting) leaves them running. Each
is labelled with its sandbox id, its owner (owner.py) and, if made to be kept, the keep
label. A container is removed here only if all of these hold: it has a gateway's name, its
owner ran on this host (in this pid namespace) and is gone, it was not made to be kept,
and the labels are its own, not its image's (an image can carry any label, and so make
a user's container look like ours; once the image is gone, that cannot be told).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker.errors
from docker import DockerClient

from sandbox_tools.mcp_gateway.isolation import as_mapping
from sandbox_tools.mcp_gateway.owner import Owner, owner_state
from sandbox_tools.mcp_gateway.spec import CONTAINER_PREFIX
from sandbox_tools.sandboxes.containers import (
    MCP_GATEWAY_LABEL,
    MCP_KEEP_LABEL,
    MCP_OWNER_LABEL,
)


@dataclass(frozen=True)
class Found:
    """One container with the gateway's label, and what cleanup makes of it."""

    name: str
    sandbox: str
    verdict: str  # "removed", or why it stays
    removed: bool


def _labels(attrs: Any) -> dict[str, str]:
    labels = as_mapping(as_mapping(as_mapping(attrs).get("Config")).get("Labels"))
    return {str(k): str(v) for k, v in labels.items()}


def _verdict(name: str, labels: dict[str, str], image_labels: dict[str, str] | None) -> str | None:
    """Why a labelled container stays, or None: it is a dead gateway's to remove."""
    if not name.startswith(CONTAINER_PREFIX):
        return f"stays: a gateway names its containers {CONTAINER_PREFIX}<id>"
    if image_labels is None:
        return "stays: its image is gone, so its labels cannot be told from the image's"
    if any(key in image_labels for key in (MCP_GATEWAY_LABEL, MCP_OWNER_LABEL, MCP_KEEP_LABEL)):
        return "stays: its image carries the gateway's labels, so they prove nothing"
    if labels.get(MCP_KEEP_LABEL) == "1":
        return "stays: made with keep"
    owner = labels.get(MCP_OWNER_LABEL)
    state = owner_state(owner) if owner else Owner.ELSEWHERE
    if state is Owner.ALIVE:
        return f"stays: its gateway ({owner}) still runs"
    if state is Owner.ELSEWHERE:
        return (
            "stays: made by a gateway on another host or in another pid namespace "
            f"({owner or 'unknown'})"
        )
    return None


def cleanup_leftovers(
    client: DockerClient, *, dry_run: bool = False, say: Callable[[Found], None] | None = None
) -> list[Found]:
    """Remove what killed gateways of this host left (`dry_run`: only say what would
    go); every labelled container found, with its verdict."""
    found: list[Found] = []
    listed = client.containers.list(
        all=True, ignore_removed=True, filters={"label": MCP_GATEWAY_LABEL}
    )
    for container in listed:
        labels = _labels(container.attrs)
        try:
            image_labels: dict[str, str] | None = _labels(
                client.images.get(container.attrs["Image"]).attrs
            )
        except (docker.errors.DockerException, KeyError):
            image_labels = None  # gone: whether it carried the labels cannot be told
        verdict = _verdict(str(container.name), labels, image_labels)
        if verdict is None and dry_run:
            verdict, removed = "would be removed: its gateway is gone", False
        elif verdict is None:
            try:
                container.remove(force=True, v=True)
                verdict, removed = "removed: its gateway is gone", True
            except docker.errors.NotFound:
                verdict, removed = "gone already", False
            except docker.errors.APIError as exc:
                verdict, removed = f"not removed: {exc.explanation or exc}", False
        else:
            removed = False
        one = Found(str(container.name), labels.get(MCP_GATEWAY_LABEL, "?"), verdict, removed)
        found.append(one)
        if say is not None:
            say(one)
    return found
