"""The choices an injection makes once for all its calls, as one value.

What to inject, where to get it and how to talk to it are decided by whoever opens tool
support (the CLI, the inspect integration, a matrix cell, a harness) and hold for every
call that handle serves. They travel down the call chain as one `InjectionOptions`, not
as loose keyword arguments repeated in each signature: a new choice is one field here
instead of a parameter in every function between the entry point and the step that
reads it, and a handle can compare what a later caller asks for with what it was opened
with in one `==`, naming the field that differs. The user a call acts as is not here: it
is a per-call value (one handle per user), passed beside the options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from sandbox_tools.artifacts import Artifact
from sandbox_tools.injector.acquire import Source


@dataclass(frozen=True, kw_only=True)
class InjectionOptions:
    """What to inject, where from, and over which transport: one value per handle.

    Frozen, so a handle's options cannot change under it; keyword-only, so a call site
    names every choice it makes. The defaults are an installation's own: the runtime for
    the sandbox's platform from this installation's sources, over a persistent channel.
    """

    # The runtime to inject. None: the first of `sources` that has one for the sandbox's
    # platform (a given artifact of another platform is refused).
    artifact: Artifact | None = None
    # Where the runtime and the browser add-on are acquired, in order of preference.
    # None: this installation's, under the settings as they stand when acquired
    # (`acquire_artifact` is a library entry point that reads them).
    sources: Sequence[Source] | None = None
    # The persistent stdio channel where the provider offers one (~1 ms per call, many
    # calls in flight); False: one exec per call.
    persistent: bool = True
    # The browser add-on, sent when a tool first needs it. None: the first of `sources`.
    browser_artifact: Artifact | None = None
    # The desktop add-on, likewise (the computer tool's).
    desktop_artifact: Artifact | None = None
    # Where the host keeps add-ons decompressed (for engines on this host) and unpacked
    # (to mount into containers made here): addon_copy.py. None: `addons` in this
    # installation's cache, under the settings as they stand.
    addons_on_host: Path | None = None

    def __post_init__(self) -> None:
        # A caller's list would stay shared with the caller, and mutable under a frozen
        # value: keep a tuple of its own (equal lists make equal tuples).
        if self.sources is not None and not isinstance(self.sources, tuple):
            object.__setattr__(self, "sources", tuple(self.sources))

    def differences(self, other: InjectionOptions) -> tuple[str, ...]:
        """The names of the fields whose values differ from `other`'s, in order."""
        return tuple(
            spec.name
            for spec in fields(self)
            if getattr(self, spec.name) != getattr(other, spec.name)
        )

    def show(self, name: str) -> str:
        """One field as `name=value` for an error message: an artifact by its name and
        build, sources by their names and directories."""
        value = getattr(self, name)
        if isinstance(value, Artifact):
            where = f", {value.path}" if value.path is not None else ""
            return f"{name}={value.name} ({value.build_id[:19]}{where})"
        if name == "sources" and value is not None:
            return f"{name}=[{', '.join(_source_label(source) for source in value)}]"
        return f"{name}={value!r}"


def _source_label(source: Source) -> str:
    directory = getattr(source, "directory", None)
    return source.name if directory is None else f"{source.name} {directory}"


DEFAULT_OPTIONS = InjectionOptions()
