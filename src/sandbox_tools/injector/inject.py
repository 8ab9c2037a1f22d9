"""Make a sandbox ready for the tools: reconnaissance -> selection -> acquisition ->
injection -> a JSON-RPC client.

Trust rules (THREAT_MODEL.md): the agent and the image are untrusted. An install is
reused only at a path this injector creates itself (`<base>/sandbox-tools-<build>`),
and only after a separate fixed command has checked, in the sandbox and before any of
it runs, that neither it, its executable nor any parent directory can be changed by
anyone but root and the runtime's uid, and that the executable has the artifact's
SHA-256; then that verified executable compares the tree it unpacked earlier, if any,
with its own payload (`verify`), since it would run that tree without reading it again.
Everything else, such as a look-alike directory someone prepared, another
user's install, another version or another tool's install, is ignored. A fresh install
goes into a directory made for it (mkdir, or mktemp -d when the name is taken), written
and verified there before it is moved into place. Failures raise SandboxInjectionError
with the reason and the remedy; there is no silent fallback.

Handles live in an `Injector` (an async context manager) keyed by the sandbox object's
identity; `tool_support_sandbox` keeps one Injector on the sandbox object itself, so a
recreated container gets fresh handles and nothing outlives the sandbox. What to inject,
where from and over which transport is one `InjectionOptions` (options.py), made by the
caller and handed down whole: an Injector holds one, every handle it opens carries it,
and a caller asking an open handle for other options is refused, the field named.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind
from sandbox_tools.errors import (
    ConfigurationError,
    SandboxExecError,
    SandboxInjectionError,
    SandboxToolsError,
)
from sandbox_tools.injector.acquire import (
    DEFAULT_FORMAT,
    acquire_artifact,
    current_build_id,
    present_artifact,
)
from sandbox_tools.injector.jsonrpc_client import (
    CLOSE_TIMEOUT,
    STAGED_LINE,
    FirstStartFailed,
    NoStreamForInput,
    RuntimeClient,
    RuntimeInfo,
    close_quietly,
    connect_runtime,
)
from sandbox_tools.injector.options import DEFAULT_OPTIONS, InjectionOptions
from sandbox_tools.injector.recon import (
    CANDIDATE_DIRS,
    CHECK_SCRIPT,
    EXE_NAME,
    INSTALL_PREFIX,
    MACHINES,
    MAX_PROBE_OUTPUT,
    PROBE_SCRIPT,
    PROBE_TIMEOUT,
    Candidate,
    CandidateStatus,
    InstallVerdict,
    Pin,
    ProbeError,
    Recon,
    parse_check,
    parse_probe,
    probe_make_argument,
)
from sandbox_tools.platforms import Arch
from sandbox_tools.protocol import SERVER_DIR_ENV
from sandbox_tools.sandboxes.base import Sandbox, Stream, StreamLineTooLong

NO_SHELL_DIR = "/tmp"
STEP_TIMEOUT = 120.0  # one injection step (mkdir, verify, move): seconds
UPLOAD_TIMEOUT = 300.0
SMALL_OUTPUT = 64 * 1024  # what the fixed injection commands may print
FIRST_CALL_TIMEOUT = 120.0  # unpack + server start + answer, under QEMU too
_FRESH_DIR = re.compile(r"/[A-Za-z0-9/._-]+")
# The portable launcher's check of the tree it unpacked beside itself against its own
# payload (launcher.c, verify_tree): exit 0 when they match or there is no tree yet.
TREE_CHECK_COMMAND = "verify"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AddonInstall:
    """An add-on in one sandbox (addon_delivery.py installs it): where, from which
    artifact, and what getting it cost."""

    directory: str
    artifact: Artifact
    entry: str  # its entry point's name in `directory` (runtime/paths.py's AddonPlace)
    reused: bool
    seconds: float  # acquisition, check, upload and unpack: what the first call waited
    sent_bytes: int  # what crossed into the sandbox (0 when reused)
    # How it arrived: "tar.xz" (streamed as built), "tar" (streamed as the host's plain
    # copy, to an engine on this host), "mount" (mounted when we made the container), or
    # "" (a checked copy was there already).
    transfer: str = ""
    # How a copy found in place was checked: "signature" (its stat signature was the one
    # this process recorded when it last saw the tree checked: nothing read), "hash"
    # (hashed in full), or "" (none was found in place: sent now, or mounted).
    check: str = ""

    @property
    def executable(self) -> str:
        return f"{self.directory}/{self.entry}"


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
    info: RuntimeInfo | None = None  # what the runtime's server said it is, when it started
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # how long getting it ready took (probe to first answer)
    # The options it was opened with: add-ons installed later come from the same sources.
    options: InjectionOptions = DEFAULT_OPTIONS
    # The add-ons installed, each once a tool needed it (addon_delivery.py).
    addons: dict[ArtifactKind, AddonInstall] = field(default_factory=dict, compare=False)
    addon_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)

    @property
    def exe(self) -> str:
        return f"{self.install_dir}/{EXE_NAME}"

    @property
    def browser(self) -> AddonInstall | None:
        return self.addons.get(ArtifactKind.BROWSER)

    @property
    def command(self) -> list[str]:
        """The runtime's argv prefix in the sandbox (its subcommands follow)."""
        return [self.exe]

    async def aclose(self) -> None:
        """Close the connection to the runtime (its server keeps running in the sandbox)."""
        await self.client.aclose()

    async def __aenter__(self) -> ToolSupport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _id_tag(artifact: Artifact) -> str:
    return artifact.build_id.removeprefix("sha256:")[:16]


def _install_path(base: str, artifact: Artifact) -> str:
    """The exact path an install of `artifact` in `base` has (the only one reused)."""
    return f"{base.rstrip('/')}/{INSTALL_PREFIX}{_id_tag(artifact)}"


def runtime_env(install_dir: str, uid: int | None = None) -> dict[str, str]:
    """The runtime's server directory: in the install directory (ours, on a file system
    known to be writable, which /tmp is not under a read-only root); one per uid when
    the runtime runs as another user than the installer."""
    name = _SERVER_DIR_NAME if uid is None else f"{_SERVER_DIR_NAME}-{uid}"
    return {SERVER_DIR_ENV: f"{install_dir}/{name}"}


_SERVER_DIR_NAME = "run"


async def run_step(
    sandbox: Sandbox,
    cmd: list[str],
    what: str,
    *,
    input: bytes | memoryview | None = None,
    user: str | None = None,
    timeout: float = STEP_TIMEOUT,
) -> tuple[int, str, str]:
    """A fixed injection command, bounded in time and bytes; failures are typed (the
    injection's steps and the browser add-on's commands)."""
    try:
        out = await sandbox.exec(
            cmd, input=input, user=user, timeout=timeout, max_output=SMALL_OUTPUT
        )
    except TimeoutError:
        raise SandboxInjectionError(
            f"{what} in {sandbox.name} did not finish within {timeout:g} s",
            remedy="Something in the sandbox blocks it (a planted FIFO, a stopped shell); "
            "check the image and the sandbox's processes.",
        ) from None
    except SandboxExecError as exc:
        raise SandboxInjectionError(f"{what} in {sandbox.name} failed: {exc.message}") from None
    stderr = out.stderr.decode(errors="replace").strip()[-500:]
    return out.returncode, out.stdout.decode(errors="replace"), stderr


async def reconnoitre(
    sandbox: Sandbox,
    timeout: float = PROBE_TIMEOUT,
    *,
    tags: Mapping[str, str] | None = None,
    pins: Mapping[str, Pin] | None = None,
) -> Recon:
    """One shell probe of the sandbox: platform, libc, user and which install places are safe.

    Everything it prints is untrusted and parsed strictly (THREAT_MODEL.md); verdicts on
    directories are computed in the sandbox, never inferred from names. With `tags` (the
    install directory's tag per `uname -m`), the probe also makes the install directory
    in the base its own verdicts chose, when nothing was installed before (`Recon.made`);
    with `pins` (the artifact at hand per `uname -m`), it checks an earlier install of
    that artifact itself (`Recon.earlier`).
    """
    make = probe_make_argument(tags or {}, pins)
    try:
        out = await sandbox.exec(
            ["sh", "-c", PROBE_SCRIPT, "probe", make, *CANDIDATE_DIRS],
            timeout=timeout,
            max_output=MAX_PROBE_OUTPUT,
        )
    except TimeoutError:
        raise SandboxInjectionError(
            f"the probe of {sandbox.name} did not finish within {timeout:g} s",
            remedy="The image's shell or tools hang; use another image.",
        ) from None
    except SandboxExecError as exc:
        if type(exc) is not SandboxExecError:  # e.g. output over the limit: a hostile shell
            raise SandboxInjectionError(
                f"the probe of {sandbox.name} failed: {exc.message}",
                remedy="The image's shell misbehaves; use another image.",
            ) from None
        out = None
    if out is not None and out.returncode == 0:
        return parse_probe(out.stdout, tags=tags, pins=pins)
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
        candidates=(Candidate(NO_SHELL_DIR, CandidateStatus.UNVERIFIED),),
        notes=(
            "no shell in the sandbox: architecture from the provider, install into a fresh "
            f"directory in {NO_SHELL_DIR} through the provider's file upload, verified by "
            "reading back",
        ),
    )


async def _probe_on_a_stream(
    sandbox: Sandbox, tags: Mapping[str, str], pins: Mapping[str, Pin]
) -> tuple[Recon, Stream] | None:
    """The probe as the first start's stream (`_PROBE_THEN_START`): its facts, and the
    stream with its shell waiting for the host's go. None, with the stream closed, where
    the provider holds no stream open or the shell ended before its facts (no shell at
    all: `reconnoitre` then says what the sandbox is); a timeout or output no probe
    prints raises as `reconnoitre` does."""
    command = ["sh", "-c", _PROBE_THEN_START, "probe", probe_make_argument(tags, pins)]
    try:
        stream = await sandbox.open_stream([*command, *CANDIDATE_DIRS])
    except (SandboxToolsError, OSError, NotImplementedError):
        return None
    if stream is None:
        return None
    try:
        output = await asyncio.wait_for(_until_probed(stream), PROBE_TIMEOUT)
        if output is None:
            await close_quietly(stream)
            return None
        return parse_probe(output, tags=tags, pins=pins), stream
    except BaseException as exc:
        await close_quietly(stream)
        if isinstance(exc, asyncio.TimeoutError):
            raise SandboxInjectionError(
                f"the probe of {sandbox.name} did not finish within {PROBE_TIMEOUT:g} s",
                remedy="The image's shell or tools hang; use another image.",
            ) from None
        if isinstance(exc, (StreamLineTooLong, _ProbeTooLong)):
            raise SandboxInjectionError(
                f"the probe of {sandbox.name} printed more than {MAX_PROBE_OUTPUT} bytes, "
                "far more than a probe prints",
                remedy="The image's shell misbehaves; use another image.",
            ) from None
        if isinstance(exc, (SandboxToolsError, OSError)) and not isinstance(exc, ProbeError):
            return None  # the stream failed: the probe on its own says why
        raise


class _ProbeTooLong(SandboxExecError):
    """The probe's stream printed more than any probe does before its end line (in
    lines each within the bound: one line past it is the stream's StreamLineTooLong)."""


async def _until_probed(stream: Stream) -> bytes | None:
    """What the probe printed before PROBED_LINE; None if the stream ended first."""
    output = bytearray()
    while True:
        # Each line within what is left of the probe's bound: a sandbox cannot make the
        # host hold more than that, in one line or in many.
        line = await stream.readline(limit=MAX_PROBE_OUTPUT - len(output))
        if not line:
            return None
        if line == PROBED_LINE:
            return bytes(output)
        output += line
        if len(output) >= MAX_PROBE_OUTPUT:
            raise _ProbeTooLong("the probe's output is over its bound")


async def _go_on_step_by_step(probed: Stream) -> bool:
    """Tell the probe's shell the host goes on without it (it ends, keeping the directory
    it made for the steps), and close its stream; False where the word may not have
    arrived (the shell then removes that directory while it is empty)."""
    try:
        await asyncio.wait_for(probed.write(STEPS_GO), CLOSE_TIMEOUT)
        arrived = True
    except (SandboxToolsError, OSError, asyncio.TimeoutError):
        arrived = False
    await close_quietly(probed)
    return arrived


async def _read_back_matches(sandbox: Sandbox, path: str, artifact: Artifact) -> bool:
    """The host hashes the file itself (sandboxes without sha256sum)."""
    try:
        data = await sandbox.read_file(path)
    except (OSError, SandboxToolsError):
        return False
    return hashlib.sha256(data).hexdigest() == artifact.sha256


async def find_trusted_install(sandbox: Sandbox, recon: Recon, artifact: Artifact) -> str | None:
    """The install dir of an earlier injection that passes every check, if any.

    Only exact paths this injector creates are considered; the check runs as a fixed
    command before anything of the install runs (THREAT_MODEL.md, rule 2).
    """
    if recon.uid is None or not any(c.has_installs for c in recon.candidates):
        return None
    if recon.earlier_sha256 == artifact.sha256:
        return await _trusted_from_the_probe(sandbox, recon, artifact)
    paths = tuple(
        _install_path(base.path, artifact) for base in recon.install_bases() if base.has_installs
    )
    if not paths:
        return None
    code, stdout, stderr = await run_step(
        sandbox,
        [
            "sh",
            "-c",
            CHECK_SCRIPT,
            "check",
            artifact.sha256,
            str(artifact.size),
            str(recon.uid),
            *paths,
        ],
        "checking earlier installs",
    )
    if code != 0:
        raise SandboxInjectionError(
            f"checking earlier installs in {sandbox.name} failed ({code}): {stderr}"
        )
    for path, verdict in parse_check(stdout.encode(), paths).items():
        verified = verdict is InstallVerdict.TRUSTED or (
            verdict is InstallVerdict.UNVERIFIED
            and await _read_back_matches(sandbox, f"{path}/{EXE_NAME}", artifact)
        )
        if verified and await _unpacked_tree_matches(sandbox, path, artifact):
            return path
    return None


async def _trusted_from_the_probe(sandbox: Sandbox, recon: Recon, artifact: Artifact) -> str | None:
    """The first earlier install, in the host's order of bases, that the probe found
    trusted with its unpacked tree the payload's; one it could not hash is read back
    and compared here, as `find_trusted_install` does."""
    verdicts = {earlier.base: earlier for earlier in recon.earlier}
    for base in recon.install_bases():
        earlier = verdicts.get(base.path)
        if earlier is None:
            continue
        path = _install_path(base.path, artifact)
        if earlier.verdict is InstallVerdict.TRUSTED:
            if earlier.tree_exit == 0 or artifact.format is not ArtifactFormat.PORTABLE:
                return path
            log.warning(
                "not reusing the install at %s in %s: its unpacked tree is not its payload "
                "(verify exited %s)",
                path,
                sandbox.name,
                earlier.tree_exit,
            )
        elif earlier.verdict is InstallVerdict.UNVERIFIED and (
            await _read_back_matches(sandbox, f"{path}/{EXE_NAME}", artifact)
            and await _unpacked_tree_matches(sandbox, path, artifact)
        ):
            return path
    return None


async def _unpacked_tree_matches(sandbox: Sandbox, install_dir: str, artifact: Artifact) -> bool:
    """Whether the runtime tree unpacked beside a verified executable, if there is one,
    is exactly that executable's payload.

    Later runs of the launcher check only the tree's owner and mode, and the executable
    is public: an image can ship it beside a tree of its own (THREAT_MODEL.md, rule 2).
    The verified executable compares the two as the installer, a fixed command that
    runs and follows nothing of the tree. A tree that differs makes the install
    untrusted: the caller installs afresh in a new directory and never touches it.
    """
    if artifact.format is not ArtifactFormat.PORTABLE:
        return True  # nothing is unpacked beside it to be run later
    with _step("verify the unpacked tree"):
        code, _, stderr = await run_step(
            sandbox,
            [f"{install_dir}/{EXE_NAME}", TREE_CHECK_COMMAND],
            f"checking the unpacked runtime in {install_dir}",
        )
    if code == 0:
        return True
    reason = stderr.splitlines()[-1] if stderr else f"exit {code}"
    log.warning(
        "not reusing the install at %s in %s: %s", install_dir, sandbox.name, ascii(reason[:300])
    )
    return False


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
    code, _, stderr = await run_step(
        sandbox,
        # A file the provider's upload left (owned by another user) is replaced, not
        # written into: the directory is the one this injection made.
        ["sh", "-c", 'rm -f "$1" && cat > "$1" && chmod 755 "$1"', "write", path],
        f"writing {path}",
        input=data,
        timeout=UPLOAD_TIMEOUT,
    )
    if code != 0:
        raise SandboxInjectionError(
            f"cannot write {path} in {sandbox.name}: {stderr}",
            remedy="Check free space and permissions of the install directory.",
        )


def _mismatch(sandbox: Sandbox, path: str, artifact: Artifact, found: str) -> SandboxInjectionError:
    return SandboxInjectionError(
        f"the artifact written to {path} in {sandbox.name} does not match: expected "
        f"sha256 {artifact.sha256}, found {found or 'nothing'}",
        remedy="The sandbox's file system altered or truncated the file; check free space.",
    )


# Create the install directory: the exact name when it is free, else a fresh one.
_MAKE_DIR = (
    'umask 022; if mkdir "$1" 2>/dev/null; then echo "$1"; '
    'else d=$(mktemp -d "$1-XXXXXXXX") && chmod 755 "$d" && echo "$d"; fi'
)
# Verify the staged file in the sandbox, then move it into place: one round trip.
_VERIFY_AND_MOVE = (
    'd=$(sha256sum < "$1" | cut -c1-64); '
    'if [ "$d" != "$3" ]; then echo "$d"; exit 3; fi; mv "$1" "$2"'
)
# The same check as the first start's prefix: the staged file's SHA-256 in the sandbox,
# then the move into place, then (only then) the runtime's first run, the command given
# after the three fixed arguments. One engine round trip less than checking first.
_CHECK_STAGED = (
    'd=$(sha256sum < "$1" | cut -c1-64); '
    'if [ "$d" != "$3" ]; then echo "sandbox-tools: the staged runtime has sha256 $d" >&2; '
    "exit 97; fi; "
)
_VERIFY_MOVE_AND_RUN = _CHECK_STAGED + 'mv "$1" "$2" || exit 98; shift 3; exec "$@"'
# The same, with the runtime's bytes arriving on the first start's own stream (one round
# trip less than an upload of their own): exactly SIZE ($4) bytes are taken from stdin
# into a file only we can open (umask 077), checked, made executable and moved into
# place; only then does the prefix print its fifth argument (the host sends nothing
# after the bytes until it does: `head` may read ahead) and run the runtime.
_RECEIVE_VERIFY_MOVE_AND_RUN = (
    'umask 077; rm -f "$1" && head -c "$4" > "$1" || exit 96; '
    + _CHECK_STAGED
    + 'chmod 755 "$1" && mv "$1" "$2" || exit 98; umask 022; echo "$5"; shift 5; exec "$@"'
)
# The probe on the first start's own stream (one round trip less again): PROBE_SCRIPT,
# then PROBED_LINE, then one line from the host, its go, tells the same shell what next:
# `install` runs the receive script above on the directory the probe made, with the
# SHA-256 and size the probe was given for its machine; `reuse` runs the earlier install
# the probe found trusted with its tree its payload's; `steps` (or any other line) ends
# the shell, the host going on step by step with what the probe made. Stdin's end (a
# host that failed, gave up or was cancelled, even before it read the findings) ends it
# too, removing the directory it made while that is still empty. Paths, digest and size
# are the shell's own, made from the host's arguments: the go carries no data.
PROBED_LINE = b"sandbox-tools: probed\n"
_STAGED = STAGED_LINE.decode("ascii").rstrip("\n")
INSTALL_GO, REUSE_GO, STEPS_GO = b"install\n", b"reuse\n", b"steps\n"
_PROBE_THEN_START = (
    # The probe's programs read nothing of the stream (the image's, and an image's tool
    # that reads its stdin would wait for the host, or swallow its go): stdin is
    # /dev/null until the findings are out, the stream kept aside on descriptor 3.
    "exec 3<&0 0</dev/null\n"
    + PROBE_SCRIPT
    + f"""echo '{PROBED_LINE.decode("ascii").rstrip()}'
exec 0<&3 3<&-
IFS= read -r go || {{ [ -z "$made" ] || rmdir "$made" 2>/dev/null; exit 0; }}
case $go in
  {INSTALL_GO.decode("ascii").strip()})
    [ -n "$made" ] && [ -n "$sha" ] && [ -n "$size" ] || exit 95
    x=$made/{EXE_NAME}
    set -- "$made/.{EXE_NAME}.partial" "$x" "$sha" "$size" "{_STAGED}" "$x" stdio ;;
  {REUSE_GO.decode("ascii").strip()})
    [ -n "$reused" ] && [ -n "$known" ] || exit 95
    x=$reused/{INSTALL_PREFIX}$known/{EXE_NAME}
    export {SERVER_DIR_ENV}="${{x%/*}}/{_SERVER_DIR_NAME}"
    echo "{_STAGED}"; exec "$x" stdio ;;
  *) exit 0 ;;
esac
export {SERVER_DIR_ENV}="$made/{_SERVER_DIR_NAME}"
"""
    + _RECEIVE_VERIFY_MOVE_AND_RUN
)
# After a first start that did not answer: was the staged file moved into place, and if
# not, what is its digest (a mismatch is reported as such, not as a silent runtime).
_STAGED_DIGEST = (
    'if [ -e "$2" ]; then echo installed; '
    'else d=$(sha256sum < "$1" | cut -c1-64); echo "staged $d"; fi'
)


@functools.lru_cache(maxsize=4)
def artifact_bytes(path: Path, sha256: str, size: int, mtime_ns: int) -> bytes:
    """One copy of an artifact's bytes shared by every injection (64 sandboxes
    injected at once held 64 copies). The key changes when the file does; the bytes are
    verified in the sandbox against `sha256` either way."""
    return path.read_bytes()


def _bytes_of(artifact: Artifact) -> bytes:
    stat = artifact.located.stat()
    return artifact_bytes(artifact.located, artifact.sha256, stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class _Install:
    """A fresh install: where, how many files were written, the check its first start
    still goes through (the staged file's SHA-256, then the move into place), if any,
    and the bytes that start receives first when they were not uploaded before it."""

    directory: str
    writes: int
    pending_check: tuple[str, ...] = ()
    pending_input: bytes | None = None

    @property
    def staging(self) -> str:
        return f"{self.directory}/.{EXE_NAME}.partial"

    @property
    def exe(self) -> str:
        return f"{self.directory}/{EXE_NAME}"

    def uploaded(self, artifact: Artifact) -> _Install:
        """The same install once its bytes were uploaded: the first start checks the
        staged file and moves it into place."""
        check = ("sh", "-c", _VERIFY_MOVE_AND_RUN, "install", self.staging, self.exe)
        return _Install(self.directory, self.writes, (*check, artifact.sha256))

    @property
    def pending(self) -> bool:
        """Whether its first start still checks and moves the bytes into place."""
        return bool(self.pending_check) or self.pending_input is not None

    def after_the_probe(self, data: bytes) -> _Install:
        """The same install with its bytes sent after the go (`install`) on the probe's
        own stream, whose script checks and moves them (the pin the probe was given is
        theirs)."""
        return _Install(self.directory, self.writes, (), data)

    def received(self, artifact: Artifact, data: bytes) -> _Install:
        """The same install with its bytes travelling on the first start's stream."""
        receive = ("sh", "-c", _RECEIVE_VERIFY_MOVE_AND_RUN, "install", self.staging, self.exe)
        staged = STAGED_LINE.decode("ascii").rstrip("\n")
        return _Install(
            self.directory,
            self.writes,
            (*receive, artifact.sha256, str(len(data)), staged),
            data,
        )


async def _install(
    sandbox: Sandbox,
    recon: Recon,
    artifact: Artifact,
    *,
    check_at_start: bool,
    on_the_stream: bool = False,
    made: str = "",
) -> _Install:
    """Upload the artifact into a fresh directory. With `check_at_start` (and sha256sum in
    the sandbox), its check and move into place are left to the prefix of its first start
    (`_Install.pending_check`), saving a round trip; with `on_the_stream` too (and a
    `head` that counts bytes), its bytes travel on that start's stream instead of an
    upload of their own, saving another. Nothing of it runs before the check either way."""
    data = _bytes_of(artifact)
    tag = _id_tag(artifact)
    if not recon.has_shell:
        # One upload creates a fresh directory holding the artifact; its bytes are read
        # back and checked before anything runs.
        install_dir = f"{NO_SHELL_DIR}/{INSTALL_PREFIX}{tag}-{_random_suffix()}"
        await sandbox.write_new_directory(install_dir, {EXE_NAME: (data, 0o755)})
        if not await _read_back_matches(sandbox, f"{install_dir}/{EXE_NAME}", artifact):
            raise _mismatch(sandbox, install_dir, artifact, "other bytes")
        return _Install(install_dir, 1)
    bases = recon.install_bases()
    if not bases:
        tried = "; ".join(f"{c.path}: {c.reason}" for c in recon.candidates)
        raise SandboxInjectionError(
            f"no directory in {sandbox.name} is both writable and allows execution (tried {tried})",
            remedy="Give the sandbox a writable location without noexec, e.g. "
            "`--tmpfs /tmp:exec` or a writable /opt.",
        )
    wanted = _install_path(bases[0].path, artifact)
    if made:  # by the probe, in bases[0] (recon.py checked it): one round trip less
        install_dir = made
    else:
        install_dir = await _make_install_dir(sandbox, wanted)
    if check_at_start and on_the_stream and recon.has_sha256sum and recon.has_head_bytes:
        return _Install(install_dir, 2).received(artifact, data)  # nothing written yet
    return await _fill_new(sandbox, recon, artifact, install_dir, data, check_at_start)


async def _make_install_dir(sandbox: Sandbox, wanted: str) -> str:
    """The exact name `wanted` when it is free, else a fresh name beside it."""
    with _step("make the install directory"):
        code, stdout, stderr = await run_step(
            sandbox, ["sh", "-c", _MAKE_DIR, "mkdir", wanted], f"creating {wanted}"
        )
    install_dir = stdout.strip()
    fresh = install_dir == wanted or (
        install_dir.startswith(f"{wanted}-") and _FRESH_DIR.fullmatch(install_dir) is not None
    )
    if code != 0 or not fresh:
        raise SandboxInjectionError(
            f"cannot create an install directory {wanted}[-XXXXXXXX] in {sandbox.name}: "
            f"{stderr or stdout.strip()[:200] or f'exit {code}'}",
            remedy="Check free space and permissions of the directory.",
        )
    return install_dir


async def _fill_new(
    sandbox: Sandbox,
    recon: Recon,
    artifact: Artifact,
    install_dir: str,
    data: bytes,
    check_at_start: bool,
) -> _Install:
    """Upload into the directory this injection made; remove it again on failure."""
    install = _Install(install_dir, 2)
    try:
        if check_at_start and recon.has_sha256sum:
            with _step("upload"):
                await _write_artifact(sandbox, recon, install.staging, data)
            return install.uploaded(artifact)
        await _fill(sandbox, recon, artifact, install_dir, data)
    except BaseException:
        await _remove_quietly(sandbox, install_dir)
        raise
    return install


# Remove a directory this injection made, unless its checked executable is in place:
# from then on another host's probe may have found it trusted and be running it (a
# failed or cancelled first start of ours must not pull it from under that host).
_REMOVE_UNLESS_INSTALLED = f'[ -e "$1/{EXE_NAME}" ] || rm -rf -- "$1"'


async def _remove_quietly(sandbox: Sandbox, install_dir: str) -> None:
    """Remove a directory this injection made and could not finish: a failure leaves
    nothing half made behind (rm -rf does not follow links the agent may have put in
    it); a directory whose checked executable is in place is a whole install, kept."""
    with contextlib.suppress(Exception):
        await asyncio.shield(
            sandbox.exec(
                ["sh", "-c", _REMOVE_UNLESS_INSTALLED, "remove", install_dir],
                timeout=STEP_TIMEOUT,
                max_output=SMALL_OUTPUT,
            )
        )


async def _fill(
    sandbox: Sandbox, recon: Recon, artifact: Artifact, install_dir: str, data: bytes
) -> None:
    staging = f"{install_dir}/.{EXE_NAME}.partial"
    exe = f"{install_dir}/{EXE_NAME}"
    with _step("upload"):
        await _write_artifact(sandbox, recon, staging, data)
    if recon.has_sha256sum:
        with _step("verify and move into place"):
            code, stdout, stderr = await run_step(
                sandbox,
                ["sh", "-c", _VERIFY_AND_MOVE, "finish", staging, exe, artifact.sha256],
                f"verifying {staging}",
            )
        if code == 3:
            raise _mismatch(sandbox, staging, artifact, stdout.strip()[:64])
    else:
        if not await _read_back_matches(sandbox, staging, artifact):
            raise _mismatch(sandbox, staging, artifact, "other bytes")
        code, stdout, stderr = await run_step(
            sandbox, ["mv", staging, exe], f"moving {staging} into place"
        )
    if code != 0:
        raise SandboxInjectionError(
            f"cannot finish the install in {install_dir}: {stderr}",
            remedy="Check permissions of the install directory.",
        )


async def _raise_if_the_check_failed(
    sandbox: Sandbox, install: _Install, artifact: Artifact
) -> None:
    """After a first start that did not answer: a staged file that failed its check (and
    so never ran) is reported as the mismatch it is."""
    exe = f"{install.directory}/{EXE_NAME}"
    code, stdout, _ = await run_step(
        sandbox,
        ["sh", "-c", _STAGED_DIGEST, "staged", install.staging, exe],
        f"checking {install.staging}",
    )
    state, _, digest = stdout.strip().partition(" ")
    if code == 0 and state == "staged" and digest != artifact.sha256:
        raise _mismatch(sandbox, install.staging, artifact, digest[:64])


def _random_suffix() -> str:
    return secrets.token_hex(4)


# Runs as the installer (root): unpack the runtime so that another user never has to
# write into the install directory, and give that user a server directory of its own.
_PREPARE_FOR_USER = (
    '"$1" unpack || exit 1; '
    'if [ ! -d "$2" ]; then mkdir -m 700 "$2" && chown "$3:$4" "$2" || exit 1; fi'
)


async def _ids_of(sandbox: Sandbox, user: str) -> tuple[int, int]:
    code, stdout, stderr = await run_step(
        sandbox, ["sh", "-c", "id -u && id -g"], f"looking up user {user!r}", user=user
    )
    ids = stdout.split()
    if code or len(ids) != 2 or not all(part.isdigit() for part in ids):
        raise SandboxInjectionError(
            f"cannot run commands as user {user!r} in {sandbox.name}: {stderr or 'no ids'}",
            remedy="Pass a user that exists in the sandbox (a name, or uid[:gid]).",
        )
    return int(ids[0]), int(ids[1])


async def _runtime_env_for(
    sandbox: Sandbox, recon: Recon, install_dir: str, user: str | None
) -> dict[str, str]:
    if user is None or not recon.has_shell:
        return runtime_env(install_dir)
    uid, gid = await _ids_of(sandbox, user)
    if uid == recon.uid:
        return runtime_env(install_dir)
    if recon.uid != 0:
        raise SandboxInjectionError(
            f"the runtime was installed in {sandbox.name} by uid {recon.uid}; running it as "
            f"user {user!r} (uid {uid}) would run files another unprivileged user controls",
            remedy="Make the sandbox's default user root, or omit user= to run the tools as "
            "the default user.",
        )
    env = runtime_env(install_dir, uid)
    code, _, stderr = await run_step(
        sandbox,
        [
            "sh",
            "-c",
            _PREPARE_FOR_USER,
            "prepare",
            f"{install_dir}/{EXE_NAME}",
            env[SERVER_DIR_ENV],
            str(uid),
            str(gid),
        ],
        f"preparing the runtime for user {user!r}",
        timeout=FIRST_CALL_TIMEOUT,
    )
    if code != 0:
        raise SandboxInjectionError(
            f"cannot prepare the runtime in {install_dir} for user {user!r}: {stderr}"
        )
    return env


# Where cold injection time goes: when a recorder is active (benchmarks), each
# step's wall time is added to it; otherwise this costs nothing.
_STEPS: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "injection_steps", default=None
)


@contextlib.contextmanager
def recording_steps() -> Iterator[dict[str, float]]:
    """Collect `{step: seconds}` for the injections made inside the block (benchmarks)."""
    steps: dict[str, float] = {}
    token = _STEPS.set(steps)
    try:
        yield steps
    finally:
        _STEPS.reset(token)


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    steps = _STEPS.get()
    if steps is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        steps[name] = steps.get(name, 0.0) + time.perf_counter() - started


async def prepare_tool_support(
    sandbox: Sandbox,
    user: str | None = None,
    *,
    options: InjectionOptions = DEFAULT_OPTIONS,
) -> ToolSupport:
    """Inject (or reuse) the runtime and connect to it; no caching here. The artifact is
    `options.artifact`, else the first of `options.sources` that has one (default: this
    installation's). The options arrive whole and stay on the handle, so what runs later
    on it (an add-on's acquisition) makes the same choices as the injection did."""
    started = time.monotonic()
    with _step("install tags (host)"):
        at_hand = await asyncio.to_thread(_install_tags, options)
    tags, pins = at_hand.tags, at_hand.pins
    probed = None
    with _step("probe (make the install directory, or check an earlier one)"):
        # As the default user and on a stream, the probe's own shell goes on to the
        # first start once the host has decided: one round trip for the whole injection.
        if user is None and options.persistent and pins:
            probed = await _probe_on_a_stream(sandbox, tags, pins)
        recon, stream = probed or (await reconnoitre(sandbox, tags=tags, pins=pins), None)
    try:
        return await _prepare(sandbox, recon, user, options, started, at_hand.build_ids, stream)
    except BaseException:
        if stream is not None:
            await close_quietly(stream)
        if recon.made:
            await _remove_quietly(sandbox, recon.made)
        raise


def _named_for(directory: str, artifact: Artifact) -> bool:
    """Whether an install directory's name is the one `artifact` is installed under
    (`sandbox-tools-<tag>`, or a fresh name beside it)."""
    name = directory.rpartition("/")[2]
    wanted = f"{INSTALL_PREFIX}{_id_tag(artifact)}"
    return name == wanted or name.startswith(f"{wanted}-")


@dataclass(frozen=True)
class _AtHand:
    """What the host knows before the probe: the install tag per machine (`uname -m`),
    the pins of the artifacts at hand, and the build id the sources make now per
    architecture (computed once per injection: it walks the sources)."""

    tags: dict[str, str]
    pins: dict[str, Pin]
    build_ids: dict[Arch, str]


def _install_tags(options: InjectionOptions) -> _AtHand:
    """The install directory's tag per machine (`uname -m`) of the artifact this injection
    will acquire for that machine, so that the probe can make the directory: the given
    artifact's, else the build id the sources make now (which every default source's
    artifact has). A wrong guess costs a round trip, never a wrong install: the directory
    is used only for an artifact of that tag. With them, the pins of the artifacts at
    hand (given, or present without a download or a build), so that the probe can check
    an earlier install itself; the verdicts count only for an artifact of that SHA-256."""
    given = options.artifact
    if given is not None:
        machine = MACHINES[given.arch]
        return _AtHand({machine: _id_tag(given)}, {machine: Pin(given.sha256, given.size)}, {})
    at_hand = _AtHand({}, {}, {})
    for arch in Arch:
        try:
            build_id = current_build_id(arch, DEFAULT_FORMAT)
        except (OSError, ValueError, SandboxToolsError):
            continue  # the probe makes nothing for it: the install step will
        machine = MACHINES[arch]
        at_hand.build_ids[arch] = build_id
        at_hand.tags[machine] = build_id.removeprefix("sha256:")[:16]
        try:
            present = present_artifact(arch, DEFAULT_FORMAT, options.sources, build_id)
        except (OSError, ValueError, SandboxToolsError):
            continue  # acquired after the probe: the check takes a round trip then
        if _id_tag(present) == at_hand.tags[machine]:
            at_hand.pins[machine] = Pin(present.sha256, present.size)
    return at_hand


async def _prepare(
    sandbox: Sandbox,
    recon: Recon,
    user: str | None,
    options: InjectionOptions,
    started: float,
    build_ids: Mapping[Arch, str],
    probed: Stream | None = None,
) -> ToolSupport:
    """The injection after the probe. `probed`: the probe's stream, its shell waiting
    for a go; it is closed (and the shell ends) where its script cannot do what is
    needed, and the steps go on without it."""
    from sandbox_tools._version import __version__

    if recon.arch is None:
        supported = ", ".join(a.platform for a in Arch)
        raise SandboxInjectionError(
            f"{sandbox.name} runs on {recon.platform}, which sandbox-tools {__version__} "
            f"does not support (supported: {supported})",
            remedy="Run the sample on an amd64 or arm64 sandbox.",
        )
    given = options.artifact
    if given is not None and given.platform != recon.arch.platform:
        raise SandboxInjectionError(
            f"{given.name} is for {given.platform}, but {sandbox.name} runs {recon.platform}",
            remedy="Pick the artifact of the sandbox's platform.",
        )
    with _step("acquire (host)"):
        artifact = (
            given
            if given is not None
            else await asyncio.to_thread(
                acquire_artifact,
                recon.arch,
                DEFAULT_FORMAT,
                options.sources,
                build_ids.get(recon.arch),
            )
        )
    writes, pending_check = 0, None
    with _step("look for a trusted install"):
        install_dir = await find_trusted_install(sandbox, recon, artifact)
    reused = install_dir is not None
    made = recon.made
    if made and not _named_for(made, artifact):
        await _remove_quietly(sandbox, made)  # made for another artifact's tag
        made = ""
    data = _bytes_of(artifact) if probed is not None and install_dir is None else b""
    if probed is not None and not _the_probes_shell_can_go_on(
        recon, artifact, install_dir, made, len(data)
    ):
        if not await _go_on_step_by_step(probed):
            made = ""  # its shell may have removed it: the steps make their own
        probed = None
    if install_dir is None:
        if probed is not None:
            # Exactly the pinned size: the shell takes that many bytes and no fewer.
            install = _Install(made, 2).after_the_probe(data)
        else:
            # As another user, the installer unpacks the runtime before the first start:
            # its bytes are checked before that, in a step of their own.
            install = await _install(
                sandbox,
                recon,
                artifact,
                check_at_start=user is None,
                on_the_stream=options.persistent,
                made=made,
            )
        install_dir, writes = install.directory, install.writes
        pending_check = install if install.pending else None
    try:
        support = await _start(
            sandbox, recon, artifact, install_dir, user, pending_check, options, probed
        )
    except BaseException:
        if writes and recon.has_shell:  # made now and unusable: leave nothing behind
            await _remove_quietly(sandbox, install_dir)
        raise
    support.reused, support.writes = reused, writes
    support.seconds = time.monotonic() - started
    log.info(
        "sandbox-tools %s in %s: %s %s (%s) at %s as uid %s in %.1f s",
        __version__,
        sandbox.name,
        "reused" if reused else "installed",
        artifact.name,
        artifact.provenance,
        install_dir,
        "?" if recon.uid is None else recon.uid,
        support.seconds,
    )
    return support


def _the_probes_shell_can_go_on(
    recon: Recon, artifact: Artifact, install_dir: str | None, made: str, sending: int = 0
) -> bool:
    """Whether the probe's waiting shell can start what the host chose: the earlier
    install its own checks found trusted with the payload's tree (`$reused`), or a fresh
    install into the directory it made, of the artifact it was pinned to (`sending`
    bytes of it at hand: the shell takes exactly the pinned size, so other bytes of
    another length would leave it waiting), with a `head` that counts bytes and a
    `sha256sum` to check them."""
    if install_dir is not None:
        return recon.earlier_sha256 == artifact.sha256 and any(
            earlier.verdict is InstallVerdict.TRUSTED
            and earlier.tree_exit == 0
            and _install_path(earlier.base, artifact) == install_dir
            for earlier in recon.earlier
        )
    return (
        bool(made)
        and recon.pin == Pin(artifact.sha256, artifact.size)
        and sending == artifact.size
        and recon.has_sha256sum
        and recon.has_head_bytes
    )


async def _start(
    sandbox: Sandbox,
    recon: Recon,
    artifact: Artifact,
    install_dir: str,
    user: str | None,
    pending_check: _Install | None,
    options: InjectionOptions,
    probed: Stream | None = None,
) -> ToolSupport:
    exe = f"{install_dir}/{EXE_NAME}"
    with _step("runtime environment"):
        env = await _runtime_env_for(sandbox, recon, install_dir, user)
    first = "first answer (unpack, server start)"
    if pending_check is not None and pending_check.pending_input is None:
        first = "verify, move into place and first answer (unpack, server start)"
    connecting = "connect (stdio: start the CLI)"
    if pending_check is not None and pending_check.pending_input is not None:
        connecting = "connect: send on the stream, verify and move into place"
    with _step(connecting):
        client, pending_check = await _connect(
            sandbox, recon, artifact, exe, env, user, pending_check, options, probed
        )
    try:
        with _step(first):
            answer = await client.call("runtime_info", timeout=FIRST_CALL_TIMEOUT)
        info = RuntimeInfo.parse(answer)
    except SandboxToolsError as exc:
        await client.aclose()
        if pending_check is not None:
            await _raise_if_the_check_failed(sandbox, pending_check, artifact)
        raise SandboxInjectionError(
            f"the runtime installed at {exe} in {sandbox.name} did not answer: {exc}",
            remedy="Check the sandbox's logs; the runtime's own log is in "
            f"{env[SERVER_DIR_ENV]}/server.log.",
        ) from None
    if info.build_id != artifact.build_id:
        await client.aclose()
        raise SandboxInjectionError(
            f"{exe} reports build {info.build_id[:100]}, expected {artifact.build_id}",
            remedy="Remove the stale install directory from the sandbox.",
        )
    return ToolSupport(
        sandbox, recon, artifact, install_dir, client, False, 0, info, user, env, options=options
    )


async def _connect(
    sandbox: Sandbox,
    recon: Recon,
    artifact: Artifact,
    exe: str,
    env: dict[str, str],
    user: str | None,
    pending: _Install | None,
    options: InjectionOptions,
    probed: Stream | None = None,
) -> tuple[RuntimeClient, _Install | None]:
    """The runtime's client; a fresh install's first start goes through its check.
    Bytes meant for a stream the provider cannot hold open are uploaded first. On the
    probe's stream, its shell gets the go (and a fresh install's bytes after it)."""
    connect = functools.partial(
        connect_runtime, sandbox, [exe], env=env, user=user, expected_build=artifact.build_id
    )
    if pending is None and probed is None:
        return await connect(persistent=options.persistent), None
    try:
        if probed is not None:
            go: tuple[bytes, ...] = (REUSE_GO,)
            if pending is not None and pending.pending_input is not None:
                go = (INSTALL_GO, pending.pending_input)
            client = await connect(first_stream=probed, first_start_input=go)
        else:
            assert pending is not None
            client = await connect(
                persistent=options.persistent,
                first_start_prefix=pending.pending_check,
                first_start_input=(
                    None if pending.pending_input is None else (pending.pending_input,)
                ),
            )
    except NoStreamForInput:
        assert pending is not None and pending.pending_input is not None
        with _step("upload"):  # nothing ran: the bytes travel on their own
            await _write_artifact(sandbox, recon, pending.staging, pending.pending_input)
        pending = pending.uploaded(artifact)
        client = await connect(first_start_prefix=pending.pending_check, persistent=False)
    except FirstStartFailed as exc:
        if pending is not None and not exc.timed_out:
            # A staging file cut short by a deadline is not other bytes: not said so.
            await _raise_if_the_check_failed(sandbox, pending, artifact)
        raise SandboxInjectionError(
            f"the runtime could not be installed at {exe} in {sandbox.name}: {exc.message}",
            remedy="Check free space in the install directory, and the image's `head` and "
            "`sha256sum`.",
        ) from None
    return client, pending


def _refuse_other_options(whose: str, held: InjectionOptions, wanted: InjectionOptions) -> None:
    """Refuse a caller whose options differ from those `whose` handles were opened with.

    Handing back the open handle would silently run another artifact, or over another
    transport, than the caller asked for; the error names each field that differs, with
    both values, so the caller sees which choice to align."""
    names = held.differences(wanted)
    if not names:
        return
    raise ConfigurationError(
        f"{whose} was opened with {', '.join(held.show(name) for name in names)}; "
        f"this call asks for {', '.join(wanted.show(name) for name in names)}",
        remedy="Pass the same InjectionOptions every time, or call forget_sandbox first "
        "(with an Injector: use another Injector for other options).",
    )


class Injector:
    """Tool support for many sandboxes, released together, all with one set of options.

    Handles are keyed by the sandbox object's identity (never by its name: a container
    recreated under the same name is another sandbox) and by user. Concurrent first
    calls for one key inject once. Use it as `async with Injector(options) as injector:`;
    on exit every client it opened is closed and every entry dropped. The options are the
    Injector's, not each call's: one Injector never holds handles made with different
    choices, so a handle it returns is always one its options describe.
    """

    def __init__(self, options: InjectionOptions = DEFAULT_OPTIONS) -> None:
        self.options = options
        self._ready: dict[tuple[int, str | None], tuple[Sandbox, ToolSupport]] = {}
        self._locks: dict[tuple[int, str | None], asyncio.Lock] = {}

    async def tool_support(self, sandbox: Sandbox, user: str | None = None) -> ToolSupport:
        """The runtime in `sandbox` for `user`, injected on the first call and reused after
        (concurrent first calls inject once)."""
        key = (id(sandbox), user)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._ready.get(key)
            if entry is not None and entry[0] is sandbox:
                return entry[1]
            support = await prepare_tool_support(sandbox, user, options=self.options)
            self._ready[key] = (sandbox, support)  # holding `sandbox` pins its id
            return support

    async def forget(self, sandbox: Sandbox) -> None:
        """Close and drop every handle for `sandbox` (it is gone, or no longer needed)."""
        keys = [key for key, (held, _) in self._ready.items() if held is sandbox]
        for key in keys:
            _, support = self._ready.pop(key)
            self._locks.pop(key, None)
            with contextlib.suppress(Exception):
                await support.aclose()
        for key in [key for key in self._locks if key[0] == id(sandbox)]:
            if not self._locks[key].locked():
                self._locks.pop(key)

    def __len__(self) -> int:
        return len(self._ready)

    async def aclose(self) -> None:
        """Close every client this injector opened; the sandboxes themselves stay."""
        entries = list(self._ready.values())
        self._ready.clear()
        self._locks.clear()
        for _, support in entries:
            with contextlib.suppress(Exception):
                await support.aclose()

    async def __aenter__(self) -> Injector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_ON_SANDBOX = "_sandbox_tools_injector"


async def tool_support_sandbox(
    sandbox: Sandbox,
    user: str | None = None,
    *,
    options: InjectionOptions = DEFAULT_OPTIONS,
) -> ToolSupport:
    """The runtime, installed and verified in `sandbox`, with a connected client.

    Concurrent first calls for one sandbox inject once; later calls return the same
    handle. The handles live on the sandbox object, so they go when it goes; call
    `forget_sandbox` to close them earlier. The first call's options hold for the
    sandbox: a later call with other options is refused, the differing field named,
    rather than given a handle that ignores them.
    """
    injector = vars(sandbox).get(_ON_SANDBOX)
    if injector is None:
        injector = Injector(options)
        setattr(sandbox, _ON_SANDBOX, injector)
    assert isinstance(injector, Injector)
    _refuse_other_options(f"tool support for {sandbox.name}", injector.options, options)
    return await injector.tool_support(sandbox, user)


@contextlib.asynccontextmanager
async def open_tool_support(
    sandbox: Sandbox,
    user: str | None = None,
    *,
    options: InjectionOptions | None = None,
    injector: Injector | None = None,
) -> AsyncIterator[ToolSupport]:
    """The runtime in `sandbox` for the length of the block: injected (or an earlier
    install reused) on entry, its client closed on exit; the runtime's server stays in
    the sandbox. With `injector`, the handle is that injector's: shared with its other
    callers, made with its options (`options`, if given too, must be the same) and closed
    when it closes. Without, `options` (default: an installation's own) are this block's."""
    if injector is not None:
        if options is not None:
            _refuse_other_options("this Injector", injector.options, options)
        yield await injector.tool_support(sandbox, user)
        return
    async with Injector(DEFAULT_OPTIONS if options is None else options) as own:
        yield await own.tool_support(sandbox, user)


async def forget_sandbox(sandbox: Sandbox) -> None:
    """Close and drop the handles `tool_support_sandbox` keeps for `sandbox`."""
    injector = vars(sandbox).pop(_ON_SANDBOX, None)
    if isinstance(injector, Injector):
        await injector.aclose()
