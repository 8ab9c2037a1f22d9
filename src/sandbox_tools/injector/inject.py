"""tool_support_sandbox: make a sandbox ready for the tools, exactly once.

reconnaissance -> selection -> acquisition -> injection -> a JSON-RPC client.

Trust rules for what is already in the sandbox: an install directory is reused only if
it is ours (owned by the sandbox user, not writable by group or others, carrying our
marker with this build id and artifact digest, and the artifact's bytes match). Anything
else, such as a directory someone prepared, another user's install, another version or
another tool's install (`/opt/inspect-sandbox-tools`), is ignored and never trusted.
Failures raise SandboxInjectionError with the reason and the remedy; there is no
silent fallback.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any

from sandbox_tools.errors import (
    SandboxExecError,
    SandboxInjectionError,
    SandboxToolsError,
)
from sandbox_tools.injector.acquire import Artifact, acquire_artifact
from sandbox_tools.injector.jsonrpc_client import RuntimeClient, connect_runtime
from sandbox_tools.injector.recon import (
    CANDIDATE_DIRS,
    PROBE_SCRIPT,
    Candidate,
    ExistingInstall,
    Recon,
    parse_probe,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.sandboxes.base import Sandbox

EXE_NAME = "sandbox-tools"
MARKER = ".installed"
NO_SHELL_DIR = "/tmp"


@dataclass
class ToolSupport:
    """A sandbox with the runtime installed and a client connected to it."""

    sandbox: Sandbox
    recon: Recon
    artifact: Artifact
    install_dir: str
    client: RuntimeClient
    reused: bool
    writes: int = 0  # files written into the sandbox by this injection (0 when reused)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def exe(self) -> str:
        return f"{self.install_dir}/{EXE_NAME}"

    async def aclose(self) -> None:
        await self.client.aclose()


def _id_tag(artifact: Artifact) -> str:
    return artifact.build_id.removeprefix("sha256:")[:16]


def _marker(artifact: Artifact) -> str:
    return f"{artifact.build_id} {artifact.sha256}"


def _trusted(install: ExistingInstall, recon: Recon, artifact: Artifact) -> bool:
    mode_ok = len(install.mode) >= 3 and install.mode[-2] in "0145" and install.mode[-1] in "0145"
    return (
        install.owner is not None
        and install.owner == recon.uid
        and mode_ok
        and install.marker == _marker(artifact)
        and install.sha256 == artifact.sha256
    )


def runtime_env(install_dir: str) -> dict[str, str]:
    # The server directory lives in the install directory: it is ours, on a file system
    # known to be writable, which /tmp is not under a read-only root without a tmpfs.
    return {"SANDBOX_TOOLS_DIR": f"{install_dir}/run"}


async def reconnoitre(sandbox: Sandbox, tag: str) -> Recon:
    try:
        out = await sandbox.exec(
            ["sh", "-c", PROBE_SCRIPT, "probe", tag, *CANDIDATE_DIRS], timeout=60
        )
    except SandboxExecError:
        out = None
    if out is not None and out.returncode == 0 and "arch=" in out.stdout.decode(errors="replace"):
        return parse_probe(out.stdout.decode(errors="replace"))
    # No shell at all (distroless, scratch): fall back to what the provider knows.
    hint = await sandbox.architecture_hint()
    if hint is None:
        reason = out.stderr.decode(errors="replace").strip()[-300:] if out else "exec failed"
        raise SandboxInjectionError(
            f"cannot inspect {sandbox.name}: the probe needs /bin/sh ({reason}) and the "
            "provider does not know the sandbox's architecture",
            remedy="Use an image with /bin/sh, or a provider that reports the architecture.",
        )
    try:
        arch: Arch | None = Arch.parse(hint)
    except ValueError:
        arch = None
    return Recon(
        arch=arch,
        raw_arch=hint,
        os_id="unknown",
        os_version="",
        libc="unknown",
        uid=None,
        user="",
        home="",
        has_shell=False,
        has_sha256sum=False,
        candidates=(Candidate(NO_SHELL_DIR, "unverified (no shell)"),),
        notes=(
            "no shell in the sandbox: architecture from the provider, install into "
            f"{NO_SHELL_DIR} through the provider's file upload, verified by reading back",
        ),
    )


async def _write_artifact(sandbox: Sandbox, recon: Recon, path: str, data: bytes) -> None:
    """Provider upload first; where the engine refuses it, stream the bytes through exec."""
    try:
        await sandbox.write_file(path, data, mode=0o755)
        return
    except SandboxToolsError as upload_error:
        if not recon.has_shell:
            raise SandboxInjectionError(
                f"cannot write {path} in {sandbox.name}: {upload_error.message}",
                remedy="Mount a writable tmpfs at /tmp, or use an image with /bin/sh.",
            ) from None
    # e.g. Docker refuses archive uploads into a container with a read-only root, even
    # onto a writable tmpfs. The path is an argument, never part of the script.
    out = await sandbox.exec(
        ["sh", "-c", 'cat > "$1" && chmod 755 "$1"', "write", path], input=data, timeout=300
    )
    if out.returncode != 0:
        raise SandboxInjectionError(
            f"cannot write {path} in {sandbox.name}: {out.stderr.decode(errors='replace')}",
            remedy="Check free space and permissions of the install directory.",
        )


async def _verify(sandbox: Sandbox, recon: Recon, path: str, artifact: Artifact) -> None:
    if recon.has_sha256sum:
        out = await sandbox.exec(["sha256sum", path], timeout=120)
        digest = out.stdout.decode(errors="replace").split(" ")[0] if out.returncode == 0 else ""
    else:
        digest = hashlib.sha256(await sandbox.read_file(path)).hexdigest()
    if digest != artifact.sha256:
        raise SandboxInjectionError(
            f"the artifact written to {path} in {sandbox.name} does not match: expected "
            f"sha256 {artifact.sha256}, found {digest or 'nothing'}",
            remedy="The sandbox's file system altered or truncated the file; check free space.",
        )


async def _install(sandbox: Sandbox, recon: Recon, artifact: Artifact) -> tuple[str, int]:
    usable = [c for c in recon.candidates if c.usable or not recon.has_shell]
    if not usable:
        tried = "; ".join(f"{c.path}: {c.status}" for c in recon.candidates)
        raise SandboxInjectionError(
            f"no directory in {sandbox.name} is both writable and allows execution (tried {tried})",
            remedy="Give the sandbox a writable location without noexec, e.g. "
            "`--tmpfs /tmp:exec` or a writable /opt.",
        )
    base = usable[0].path.rstrip("/")
    tag = _id_tag(artifact)
    taken = {install.path for install in recon.installs}
    install_dir = f"{base}/{EXE_NAME}-{tag}"
    if install_dir in taken or not recon.has_shell:
        # Exists but failed the trust check (never reuse it), or we cannot look: fresh name.
        install_dir = f"{install_dir}-{secrets.token_hex(4)}"
    data = artifact.path.read_bytes()
    exe = f"{install_dir}/{EXE_NAME}"
    if not recon.has_shell:
        # One upload creates the directory with the artifact and our marker; the bytes are
        # then read back and checked before anything runs.
        await sandbox.write_new_directory(
            install_dir, {EXE_NAME: (data, 0o755), MARKER: (_marker(artifact).encode(), 0o644)}
        )
        await _verify(sandbox, recon, exe, artifact)
        return install_dir, 1
    staging = f"{install_dir}/.{EXE_NAME}.partial"
    made = await sandbox.exec(["sh", "-c", 'umask 022 && mkdir "$1"', "mkdir", install_dir])
    if made.returncode != 0:
        raise SandboxInjectionError(
            f"cannot create {install_dir} in {sandbox.name}: "
            f"{made.stderr.decode(errors='replace').strip()}",
            remedy="Someone else may have created it; remove it or free the directory.",
        )
    await _write_artifact(sandbox, recon, staging, data)
    await _verify(sandbox, recon, staging, artifact)
    moved = await sandbox.exec(
        [
            "sh",
            "-c",
            'mv "$1" "$2" && printf %s "$3" > "$4" && chmod 755 "$5"',
            "finish",
            staging,
            exe,
            _marker(artifact),
            f"{install_dir}/{MARKER}",
            install_dir,
        ]
    )
    if moved.returncode != 0:
        raise SandboxInjectionError(
            f"cannot finish the install in {install_dir}: "
            f"{moved.stderr.decode(errors='replace').strip()}",
            remedy="Check permissions of the install directory.",
        )
    return install_dir, 2


_LOCKS: dict[str, asyncio.Lock] = {}
_READY: dict[str, ToolSupport] = {}


async def tool_support_sandbox(
    sandbox: Sandbox,
    user: str | None = None,
    persistent: bool = True,
    artifact: Artifact | None = None,
) -> ToolSupport:
    """The runtime, installed and verified in `sandbox`, with a connected client.

    Concurrent first calls for one sandbox inject once; later calls return the same handle.
    """
    key = f"{sandbox.name}|{user}"
    lock = _LOCKS.setdefault(key, asyncio.Lock())
    async with lock:
        ready = _READY.get(key)
        if ready is not None:
            return ready
        support = await _prepare(sandbox, user, persistent, artifact)
        _READY[key] = support
        return support


def forget_sandbox(sandbox: Sandbox) -> None:
    """Drop cached handles for a sandbox that is gone."""
    for key in [k for k in _READY if k.startswith(f"{sandbox.name}|")]:
        _READY.pop(key, None)


async def _prepare(
    sandbox: Sandbox, user: str | None, persistent: bool, given: Artifact | None
) -> ToolSupport:
    from sandbox_tools._version import __version__

    recon = await reconnoitre(sandbox, "")  # selection needs the platform: probe first
    if recon.arch is None:
        supported = ", ".join(a.platform for a in Arch)
        raise SandboxInjectionError(
            f"{sandbox.name} runs on {recon.platform}, which sandbox-tools {__version__} "
            f"does not support (supported: {supported})",
            remedy="Run the sample on an amd64 or arm64 sandbox.",
        )
    if given is not None and given.platform != recon.arch.platform:
        raise SandboxInjectionError(
            f"{given.name} is for {given.platform}, but {sandbox.name} runs {recon.platform}",
            remedy="Pick the artifact of the sandbox's platform.",
        )
    if given is None:
        artifact = await asyncio.to_thread(acquire_artifact, recon.arch)
    else:
        artifact = given
    # Re-probe with the build id: finds earlier installs of exactly this build.
    if recon.has_shell:
        recon = await reconnoitre(sandbox, _id_tag(artifact))
    reused = False
    writes = 0
    install_dir = ""
    for install in recon.installs:
        if _trusted(install, recon, artifact):
            install_dir, reused = install.path, True
            break
    if not reused:
        install_dir, writes = await _install(sandbox, recon, artifact)
    exe = f"{install_dir}/{EXE_NAME}"
    env = runtime_env(install_dir)
    client = await connect_runtime(sandbox, [exe], env=env, user=user, persistent=persistent)
    try:
        info = await client.call("runtime_info", timeout=120)
    except SandboxToolsError as exc:
        await client.aclose()
        raise SandboxInjectionError(
            f"the runtime installed at {exe} in {sandbox.name} did not answer: {exc}",
            remedy="Check the sandbox's logs; the runtime's own log is in "
            f"{env['SANDBOX_TOOLS_DIR']}/server.log.",
        ) from None
    if info.get("build_id") != artifact.build_id:
        await client.aclose()
        raise SandboxInjectionError(
            f"{exe} reports build {info.get('build_id')}, expected {artifact.build_id}",
            remedy="Remove the stale install directory from the sandbox.",
        )
    return ToolSupport(sandbox, recon, artifact, install_dir, client, reused, writes, info)
