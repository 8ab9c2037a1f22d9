"""The add-ons (the browser, the desktop), installed into a sandbox the first time a
tool needs one.

Same trust rules as the runtime (THREAT_MODEL.md, rule 2): the add-on goes into the
runtime's own install directory, which only root and the runtime's uid can change (the
runtime's reuse check established that); the archive is streamed into the runtime's
fixed `addon-install` command, which checks its SHA-256 and the unpacked tree's digest
before the tree is renamed into place, and nothing of it runs before that. A tree found
there is reused only after `addon-check` walked it in place and found the pinned digest,
owned by root or the installer, writable by nobody else. Free space is checked before a
byte is sent. Every step is a fixed command with a deadline; failures are
SandboxInjectionError with the reason and the remedy.

A later handle in the same sandbox does not hash the tree again: the check or install
that last accepted it answered the tree's stat signature (runtime/addons.py), which this
process keeps on the sandbox object (`CheckedTrees`) and hands to the next
`addon-check`; the runtime stats the entries and answers "ok" only when nothing moved
since, else hashes the tree as before. The record is host memory, never the sandbox's.

The runtime finds an add-on by itself (`<install dir>/browser/chrome`,
`<install dir>/desktop/desktop`), also when its server started before the add-on
arrived, so inspect's own host code and our MCP mode use the browser without being told.
Each add-on is declared once (`ADDONS`): where it goes, its entry point, and the runtime
method that says which entry point the runtime would start (and checks a tree on the
channel).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox_tools.artifacts import Artifact, ArtifactKind
from sandbox_tools.errors import SandboxInjectionError
from sandbox_tools.injector.acquire import acquire_addon
from sandbox_tools.injector.addon_copy import (
    PlainCopy,
    addons_on_host,
    forget_if_changed,
    mapped,
    mount_target,
    plain_copy,
)
from sandbox_tools.injector.inject import AddonInstall, ToolSupport, artifact_bytes, run_step
from sandbox_tools.injector.log_bounds import said
from sandbox_tools.injector.options import InjectionOptions
from sandbox_tools.runtime.addons import PLAIN, SIGNATURE, XZ, TreeDigest, needed_bytes
from sandbox_tools.runtime.paths import BROWSER, DESKTOP, AddonPlace
from sandbox_tools.sandboxes.base import Sandbox

__all__ = ["ADDONS", "AddonInstall", "ensure_addon", "ensure_browser", "install_addon"]


@dataclass(frozen=True)
class Addon:
    """How one add-on is delivered: its kind, its place beside the runtime, the artifact
    the injection's options pin, and the runtime's info method (`browser_info`,
    `computer_info`): the entry point the runtime would start now, and a tree checked on
    the channel."""

    kind: ArtifactKind
    place: AddonPlace
    pinned: Callable[[InjectionOptions], Artifact | None]
    info_method: str
    info_params: dict[str, Any]  # what makes the info method start nothing

    @property
    def name(self) -> str:
        return f"{self.kind.value} add-on"


ADDONS = {
    ArtifactKind.BROWSER: Addon(
        ArtifactKind.BROWSER,
        BROWSER,
        lambda o: o.browser_artifact,
        "browser_info",
        {"version": False},
    ),
    ArtifactKind.DESKTOP: Addon(
        ArtifactKind.DESKTOP, DESKTOP, lambda o: o.desktop_artifact, "computer_info", {}
    ),
}

CHECK_TIMEOUT = 120.0  # walking and hashing ~300 MiB; QEMU included
INSTALL_TIMEOUT = 900.0  # 100 MB streamed in, unpacked and hashed: ~6 s native, minutes under QEMU

log = logging.getLogger(__name__)


class CheckedTrees:
    """The stat signatures of the add-on trees this process saw checked in one sandbox,
    by (directory, tree digest): what lets a later handle skip the hash.

    It lives on the sandbox object (`of`), as `tool_support_sandbox` keeps its Injector
    there, and not on a handle or an Injector: a later sample's handle is a new
    ToolSupport, often from a new Injector (`forget_sandbox` drops the old one, and the
    MCP gateway keys handles by user too), but the same sandbox object. A sandbox
    object is one sandbox for its life (a container made again under the same name is
    another object), so a record never reaches another sandbox; a process-wide table
    keyed by `id(sandbox)` would outlive the object, and another sandbox could get its
    id. A new host process, or a new sandbox object, starts with none: its first check
    hashes the tree. The record is only ever handed back to the runtime, which
    compares it with what it stats; on its own it makes nothing "ok"."""

    _ATTRIBUTE = "_sandbox_tools_checked_trees"

    def __init__(self) -> None:
        self._signatures: dict[tuple[str, str], str] = {}

    @classmethod
    def of(cls, sandbox: Sandbox) -> CheckedTrees:
        trees = vars(sandbox).get(cls._ATTRIBUTE)
        if not isinstance(trees, CheckedTrees):
            trees = cls()
            setattr(sandbox, cls._ATTRIBUTE, trees)
        return trees

    def signature(self, directory: str, digest: str) -> str | None:
        return self._signatures.get((directory, digest))

    def record(self, directory: str, digest: str, answer: dict[str, Any]) -> None:
        """Keep the signature of `answer` (an addon-check or addon-install that accepted
        the tree); drop the record when it has none, or none of the right form."""
        signature = answer.get("signature")
        if isinstance(signature, str) and SIGNATURE.fullmatch(signature):
            self._signatures[directory, digest] = signature
        else:
            self.forget(directory, digest)

    def forget(self, directory: str, digest: str) -> None:
        self._signatures.pop((directory, digest), None)


def _tree_of(artifact: Artifact) -> TreeDigest:
    """What the pinned archive unpacks to, from its record: `tools build` computed it and
    `tools validate` checked it against the archive, so no host hashes ~300 MiB at eval
    time. The runtime checks the unpacked tree against it before using any of it."""
    if artifact.tree is None:
        flag = f"--with-{artifact.kind.value}"
        raise SandboxInjectionError(
            f"the record of {artifact.name} has no tree digest (an add-on built by an older "
            "sandbox-tools)",
            remedy=f"Build it again (tools build {flag}) or fetch this version's "
            f"release (tools fetch {flag}).",
        )
    return artifact.tree


async def _runtime_command(
    support: ToolSupport,
    args: list[str],
    what: str,
    timeout: float,
    data: bytes | memoryview | None = None,
) -> dict[str, Any]:
    """One of the runtime's fixed add-on commands, run as the installer; its JSON line."""
    sandbox = support.sandbox
    code, stdout, stderr = await run_step(
        sandbox, [support.exe, *args], what, input=data, timeout=timeout
    )
    if code != 0:
        reason = stderr.removeprefix("sandbox-tools: ")
        raise SandboxInjectionError(
            f"{what} in {sandbox.name} failed: {reason or f'exit {code}'}",
            remedy="Check free space and permissions of the runtime's install directory.",
        )
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("state"), str):
        raise SandboxInjectionError(f"{what} in {sandbox.name} gave no answer: {lines[-1:]!r:.200}")
    return answer


def _free_bytes(addon: Addon, answer: dict[str, Any], sandbox: str) -> int:
    """The free space addon-check reported: a count, or a typed error (whatever answers
    in the sandbox may send Infinity, a list or a bool)."""
    free = answer.get("free_bytes")
    if not isinstance(free, int) or isinstance(free, bool) or free < 0:
        raise SandboxInjectionError(
            f"checking the {addon.name} in {sandbox} answered free_bytes={free!r:.50}"
        )
    return free


async def _would_start(support: ToolSupport, addon: Addon) -> str:
    """The entry point the runtime would start now (its info method, running nothing)."""
    info = await support.client.call(addon.info_method, dict(addon.info_params))
    executable = info.get("executable") if isinstance(info, dict) else None
    return executable if isinstance(executable, str) else repr(executable)[:200]


async def _runtime_uses(support: ToolSupport, addon: Addon, mounted: str) -> bool:
    """Whether the runtime accepted the tree mounted at `mounted` as its add-on. It
    refuses one it cannot trust as a mount (an image's world-writable or linked
    `/.sandbox-tools-addons` moves or exposes it, an image's volume stacks on it); the
    add-on is then sent as anywhere else, and checked."""
    uses = await _would_start(support, addon) == f"{mounted}/{addon.place.entry}"
    if not uses:
        log.warning(
            "%s: the runtime does not use the %s mounted at %s; sending it",
            support.sandbox.name,
            addon.name,
            mounted,
        )
    return uses


async def _check(
    support: ToolSupport, addon: Addon, directory: str, digest: str, signature: str | None
) -> tuple[dict[str, Any], str | None]:
    """The add-on's check (`runtime/addons.py`), by `signature` where there is one, and
    the entry point the runtime would start now where that came with it. A server
    running as the installer makes the check on the channel (the add-on's info method):
    one round trip where an exec started an interpreter, a third of a later handle's
    time; a server running as another user (`user=`) may not judge the installer's tree,
    so there the installer's `addon-check` makes it."""
    if support.user is not None:
        found = await _runtime_command(
            support,
            ["addon-check", directory, digest, *([signature] if signature else [])],
            f"checking the {addon.name}",
            CHECK_TIMEOUT,
        )
        return found, None
    params: dict[str, Any] = {**addon.info_params, "addon_dir": directory, "addon_digest": digest}
    if signature:
        params["addon_signature"] = signature
    info = await support.client.call(addon.info_method, params, timeout=CHECK_TIMEOUT)
    answer = info.get("addon") if isinstance(info, dict) else None
    if not isinstance(answer, dict) or not isinstance(answer.get("state"), str):
        raise SandboxInjectionError(
            f"checking the {addon.name} in {support.sandbox.name} gave no answer: {said(answer)}"
        )
    executable = info.get("executable")
    return answer, executable if isinstance(executable, str) else repr(executable)[:200]


async def _send(
    support: ToolSupport, addon: Addon, artifact: Artifact, directory: str
) -> tuple[int, str, dict[str, Any]]:
    """Stream the add-on into the runtime's `addon-install`: its plain tar where bytes
    into the sandbox are cheap (an engine on this host), else the pinned archive.
    (bytes sent, the format sent as, addon-install's answer)."""
    tree = _tree_of(artifact)
    located = artifact.located
    copy: PlainCopy | None = None
    data: bytes | memoryview
    if support.sandbox.bytes_are_cheap:
        copies, _ = addons_on_host(support.options)
        copy = await asyncio.to_thread(plain_copy, artifact, copies)
        fmt = PLAIN
        # The providers that get it (ours on a local engine, inspect's docker and local)
        # send any buffer; the others get bytes.
        data = await asyncio.to_thread(mapped, copy.path, copy.size, copy.path.stat().st_mtime_ns)
    else:
        fmt = XZ
        # One copy of the bytes for every install at once (as for the runtime's).
        mtime_ns = located.stat().st_mtime_ns
        data = await asyncio.to_thread(
            artifact_bytes, located, artifact.sha256, artifact.size, mtime_ns
        )
    try:
        answer = await _runtime_command(
            support,
            ["addon-install", directory, tree.digest, str(tree.size), fmt],
            f"installing the {addon.name}",
            INSTALL_TIMEOUT,
            data,
        )
    except SandboxInjectionError:
        if copy is not None:
            # A copy changed on the host since it was made fails in every sandbox:
            # drop it, so that the next call makes it again from the pinned archive.
            await asyncio.to_thread(forget_if_changed, copy)
        raise
    return len(data), fmt, answer


async def ensure_addon(support: ToolSupport, kind: ArtifactKind) -> AddonInstall:
    """The add-on `kind` beside `support`'s runtime, installed on the first call and
    remembered for the handle's life (concurrent first calls install once)."""
    async with support.addon_lock:
        installed = support.addons.get(kind)
        if installed is None:
            installed = support.addons[kind] = await install_addon(support, kind)
        return installed


async def ensure_browser(support: ToolSupport) -> AddonInstall:
    """The browser add-on (`ensure_addon`)."""
    return await ensure_addon(support, ArtifactKind.BROWSER)


async def install_addon(support: ToolSupport, kind: ArtifactKind) -> AddonInstall:
    """Make the add-on `kind` ready beside `support`'s runtime (a ToolSupport): reused
    when the pinned tree is there, else sent and unpacked now. The add-on is the one the
    handle's options pin (`browser_artifact`, `desktop_artifact`), else the first of its
    `options.sources` (default: this installation's) that has it: the choices the
    runtime was injected with."""
    addon = ADDONS[kind]
    started = time.monotonic()
    arch = support.recon.arch
    assert arch is not None  # the runtime runs, so the platform is a supported one
    options = support.options
    artifact = addon.pinned(options)
    if artifact is None:
        artifact = await asyncio.to_thread(acquire_addon, kind, arch, options.sources)
    if artifact.kind is not kind or artifact.platform != arch.platform:
        raise SandboxInjectionError(
            f"{artifact.name} is not the {addon.name} for {arch.platform}",
            remedy=f"Pass the add-on of the sandbox's platform (tools build --with-{kind.value}).",
        )
    tree = _tree_of(artifact)
    directory = f"{support.install_dir}/{addon.place.directory}"
    mounted = mount_target(addon.place.directory, tree)
    if support.sandbox.mounted_read_only(mounted) and await _runtime_uses(support, addon, mounted):
        # We made the container with the checked tree mounted there: nothing to send or
        # hash, and the runtime finds it by itself (paths.mounted_addon).
        return _installed(support, addon, artifact, mounted, started, reused=False)
    checked = CheckedTrees.of(support.sandbox)
    recorded = checked.signature(directory, tree.digest)
    found, starts = await _check(support, addon, directory, tree.digest, recorded)
    sent, transfer, method = 0, "", ""
    if found.get("state") == "ok":
        checked.record(directory, tree.digest, found)
        method = "signature" if found.get("method") == "signature" else "hash"
    else:
        checked.forget(directory, tree.digest)
        if found.get("state") == "different":
            log.warning(
                "%s: %s is not the pinned add-on (%s); installing it again",
                support.sandbox.name,
                directory,
                said(found.get("why")),  # names from the sandbox: escaped, cut
            )
        free, needed = _free_bytes(addon, found, support.sandbox.name), needed_bytes(tree.size)
        if free < needed:
            raise SandboxInjectionError(
                f"the {addon.name} needs {needed >> 20} MiB free in {support.install_dir} "
                f"in {support.sandbox.name}; {free >> 20} MiB are",
                remedy="Give the sandbox more disk (or a larger tmpfs where the runtime is "
                f"installed), or do without the {kind.value} there.",
            )
        sent, transfer, installed = await _send(support, addon, artifact, directory)
        checked.record(directory, tree.digest, installed)
        starts = None
    # The runtime must start what was checked: never an add-on it takes for a mount of
    # ours, or the image's, in its place.
    if starts is None:
        starts = await _would_start(support, addon)
    if starts != f"{directory}/{addon.place.entry}":
        raise SandboxInjectionError(
            f"the runtime in {support.sandbox.name} would start {said(starts)} as its "
            f"{kind.value}, not the add-on checked at {directory}",
            remedy="Something in the image takes the add-on's place (a volume or a tree "
            "under /.sandbox-tools-addons); use another image.",
        )
    return _installed(
        support, addon, artifact, directory, started, sent == 0, sent, transfer, method
    )


def _installed(
    support: ToolSupport,
    addon: Addon,
    artifact: Artifact,
    directory: str,
    started: float,
    reused: bool,
    sent: int = 0,
    transfer: str = "mount",
    check: str = "",
) -> AddonInstall:
    install = AddonInstall(
        directory=directory,
        artifact=artifact,
        entry=addon.place.entry,
        reused=reused,
        seconds=time.monotonic() - started,
        sent_bytes=sent,
        transfer=transfer,
        check=check,
    )
    log.info(
        "%s in %s: %s %s (%s) at %s in %.1f s",
        addon.name,
        support.sandbox.name,
        f"reused (checked by {check}):" if reused else f"installed ({transfer}):",
        artifact.name,
        artifact.provenance,
        directory,
        install.seconds,
    )
    return install
