"""What one `tools` command runs with, resolved once by the root callback and passed down.

The settings cascade (defaults, pyproject, environment, then the root's flags) runs
once per invocation; the container policy (keep, echo under --verbose, and the tracker
Ctrl-C empties) is made from it. Commands take them from the click context, and pass
them on as values: nothing below the CLI looks them up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from sandbox_tools.settings import Settings

if TYPE_CHECKING:
    from sandbox_tools.sandboxes.containers import ContainerPolicy
    from sandbox_tools.sandboxes.images import RootfsStore


@dataclass(frozen=True)
class Invocation:
    settings: Settings
    echo: Callable[[str], None] | None = None  # --verbose: each container as `+ docker ...`

    # Made on first use: commands that start no container never import the Docker SDK.
    @functools.cached_property
    def containers(self) -> ContainerPolicy:
        from sandbox_tools.sandboxes.containers import ContainerPolicy

        return ContainerPolicy.of(self.settings, self.echo)

    @functools.cached_property
    def roots(self) -> RootfsStore:
        from sandbox_tools.sandboxes.images import RootfsStore

        return RootfsStore.of(self.settings)


def invocation(ctx: typer.Context) -> Invocation:
    """The invocation the root callback resolved for this command."""
    found = ctx.find_root().obj
    if not isinstance(found, Invocation):  # a command called without the root callback
        raise RuntimeError("tools commands run under the root callback, which resolves settings")
    return found
