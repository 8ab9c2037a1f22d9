"""One Chromium process: started as the identity a call acts as, stopped as a group.

Why it is started this way:
- `--remote-debugging-pipe`, never a port: the protocol travels on two pipes only this
  server holds (Chromium reads fd 3, writes fd 4), so no other user of the container can
  reach the browser, and no agent can point its own client at it;
- the identity is switched by the kernel as the child starts (as exec_remote does for
  `user`), before the browser touches a file, so it never has more rights than the agent;
- the profile is a fresh directory of a random name (mode 0700), handed to that identity
  through a descriptor of the directory we just made (never a path someone could swap),
  and the browser's caches and config go inside it (XDG_*): no other user reads them;
- its own session and process group, so a stop kills renderers and helpers with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import stat
from dataclasses import dataclass, field

from sandbox_tools.runtime.child_env import child_environment, unprotect
from sandbox_tools.runtime.identity import Identity
from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.paths import private_directory, temporary_base
from sandbox_tools.runtime.tools.web_browser.cdp import BrowserFailed, CdpConnection, EventHandler

VIEWPORT_WIDTH = 1280
VIEWPORT_HEIGHT = 1080
# One DevTools message from the browser at most; a DOM snapshot of a very large page is
# tens of MB, a screenshot of our viewport a few.
MAX_CDP_FRAME_BYTES = 128 * 1024 * 1024
# The browser's last words on stderr, kept to explain a failed start.
STDERR_KEPT_BYTES = 4096
# Chromium's DevTools pipe: it reads commands from fd 3 and writes to fd 4.
CDP_READ_FD = 3
CDP_WRITE_FD = 4

_FLAGS = (
    "--headless",
    "--remote-debugging-pipe",
    # No sandbox and no zygote: containers rarely allow the namespaces Chromium's sandbox
    # needs, and the browser has no rights beyond the agent's anyway (THREAT_MODEL.md).
    "--no-sandbox",
    "--no-zygote",
    "--disable-gpu",
    "--disable-dev-shm-usage",  # a container's /dev/shm is often 64 MB
    f"--window-size={VIEWPORT_WIDTH},{VIEWPORT_HEIGHT}",
    "--hide-scrollbars",
    "--mute-audio",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-sync",
    "--disable-extensions",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--password-store=basic",
    "--use-mock-keychain",
    "--lang=en-GB",
    # Back and forward load pages again instead of restoring them from memory, so every
    # history step ends with the same load events a navigation does.
    "--disable-features=BackForwardCache",
    # Sites that refuse automated browsers look for this flag's effect.
    "--disable-blink-features=AutomationControlled",
)

# What the browser's processes get of the image's environment: where to send traffic,
# the time zone and the temporary directory, which name no code. Everything else is
# left behind: the browser is the host's checked program, and variables of the image's
# named code for it to load (LD_PRELOAD, a locale whose charset loads a gconv module,
# Vulkan layers and drivers, a fontconfig configuration naming the image's files).
BROWSER_PASSED = (
    "TZ",
    "TMPDIR",
    *(f"{scheme}_proxy" for scheme in ("http", "https", "all", "no")),
    *(f"{scheme}_PROXY" for scheme in ("HTTP", "HTTPS", "ALL", "NO")),
)
# Beside the add-on's entry point: its fonts and its Vulkan driver (SwiftShader).
BROWSER_FONTS = "fonts.conf"
BROWSER_VULKAN_DRIVER = "vk_swiftshader_icd.json"


def browser_environment(executable: str, identity: Identity, profile: str) -> dict[str, str]:
    """The browser's whole environment (BROWSER_PASSED of the image's, the rest ours).

    Its home is the private profile, so nothing of a home directory (an NSS database
    naming PKCS#11 modules, configuration) is read; the locale is the C library's own
    "C", which reads no locale file and loads no conversion module; every XDG directory
    is the profile's or the add-on's; Vulkan loads no layer, and only the add-on's
    driver where the add-on is what runs."""
    image = child_environment()
    tree = os.path.dirname(executable)
    env = {name: image[name] for name in BROWSER_PASSED if name in image}
    env.update(identity.env())  # its user's names; its home is the profile (below)
    env.update(
        {
            "PATH": "/usr/bin:/bin",
            "HOME": profile,
            "LC_ALL": "C",
            "XDG_CONFIG_HOME": os.path.join(profile, "config"),
            "XDG_CACHE_HOME": os.path.join(profile, "cache"),
            "XDG_DATA_HOME": os.path.join(profile, "data"),
            "XDG_CONFIG_DIRS": tree,
            "XDG_DATA_DIRS": tree,
            "VK_LOADER_LAYERS_DISABLE": "~all~",
        }
    )
    beside = {"FONTCONFIG_FILE": BROWSER_FONTS, "VK_DRIVER_FILES": BROWSER_VULKAN_DRIVER}
    for variable, name in beside.items():
        path = os.path.join(tree, name)
        if os.path.isfile(path):
            env[variable] = path
    return env


@dataclass
class BrowserProcess:
    process: asyncio.subprocess.Process
    connection: CdpConnection
    profile_dir: str
    identity: Identity
    version: str
    stderr_tail: collections.deque[bytes]
    tasks: list[asyncio.Task[None]]
    # A descriptor of the leader process itself (Linux >= 5.3), opened before it could
    # be reaped: a signal through it never reaches a process that later got its pid.
    pidfd: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.process.pid


def profile_base() -> str:
    """Where profiles are made (paths.temporary_base)."""
    base = temporary_base()
    if base is None:
        raise ToolError(
            "no directory for the browser's profile that only root and the runtime's user "
            "can change (tried $TMPDIR, /tmp, /var/tmp, /dev/shm)"
        )
    return base


def _private_profile(identity: Identity) -> str:
    """A new directory only `identity` may enter (made by us, then given to it)."""
    return private_directory(profile_base(), "sandbox-tools-browser-", identity.uid, identity.gid)


def _child_pipes(read_end: int, write_end: int) -> None:
    """In the forked child: put the DevTools pipe on fds 3 and 4 (Chromium's fixed
    numbers). Copies first, so neither end is overwritten by the other's move; then the
    two are made inheritable (dup2 onto the same number would keep close-on-exec)."""
    read_copy, write_copy = os.dup(read_end), os.dup(write_end)
    os.dup2(read_copy, CDP_READ_FD)
    os.dup2(write_copy, CDP_WRITE_FD)
    os.set_inheritable(CDP_READ_FD, True)
    os.set_inheritable(CDP_WRITE_FD, True)


async def _keep_tail(stream: asyncio.StreamReader, tail: collections.deque[bytes]) -> None:
    """Drain the browser's stderr (it must never block on it), keeping only its end."""
    size = 0
    while chunk := await stream.read(4096):
        tail.append(chunk)
        size += len(chunk)
        while size > STDERR_KEPT_BYTES and len(tail) > 1:
            size -= len(tail.popleft())


async def launch(
    executable: str, identity: Identity, on_event: EventHandler, timeout: float
) -> BrowserProcess:
    """Start the browser as `identity`; BrowserFailed if it does not answer in time."""
    if not os.access(executable, os.X_OK):
        raise ToolError(
            f"no browser at {executable}: open the browser through the host (it installs "
            "the add-on), or point SANDBOX_TOOLS_BROWSER at a Chromium headless shell "
            "before the runtime's server starts"
        )
    profile = _private_profile(identity)
    # The browser is the host's checked program, not one of the image's commands
    # (THREAT_MODEL.md, "Delivering the add-on").
    env = browser_environment(executable, identity, profile)
    to_browser_read, to_browser_write = os.pipe()
    from_browser_read, from_browser_write = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            executable,
            *_FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            # Its own directory, whoever it runs as: the C library opens an NSS module
            # the image's /etc/nsswitch.conf names with a slash relative to it.
            cwd=profile,
            start_new_session=True,
            user=identity.uid,
            group=identity.gid,
            extra_groups=identity.groups,
            # The pipes must sit on fds 3 and 4 in the child, which pass_fds cannot do;
            # everything else the server holds is close-on-exec (PEP 446), so close_fds
            # is not needed to keep it from the browser.
            close_fds=False,
            preexec_fn=lambda: _child_pipes(to_browser_read, from_browser_write),
        )
    except OSError as exc:
        shutil.rmtree(profile, ignore_errors=True)
        raise ToolError(f"cannot start the browser {executable}: {exc.strerror or exc}") from None
    finally:
        os.close(to_browser_read)
        os.close(from_browser_write)
    pidfd = _open_pidfd(process)
    unprotect(process.pid)
    tail: collections.deque[bytes] = collections.deque()
    assert process.stderr is not None
    tasks = [asyncio.create_task(_keep_tail(process.stderr, tail))]
    connection = CdpConnection(MAX_CDP_FRAME_BYTES, on_event)
    await connection.open(from_browser_read, to_browser_write)
    browser = BrowserProcess(process, connection, profile, identity, "", tail, tasks, pidfd)
    try:
        version = await connection.call("Browser.getVersion", timeout=timeout)
        await connection.call("Target.setDiscoverTargets", {"discover": True}, timeout=timeout)
    except BrowserFailed as exc:
        await stop(browser)
        said = b"".join(tail).decode(errors="replace").strip()[-1000:]
        raise BrowserFailed(
            f"{executable} did not start ({exc.reason})" + (f"; it said: {said}" if said else "")
        ) from None
    product = version.get("product")
    browser.version = product if isinstance(product, str) else "unknown"
    return browser


def _open_pidfd(process: asyncio.subprocess.Process) -> int | None:
    """A pidfd of the browser's leader, or None where the kernel has none. Opened before
    the loop runs again; a leader already reaped (its pid perhaps someone else's) is not
    opened."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None or process.returncode is not None:
        return None
    try:
        fd: int = pidfd_open(process.pid)
    except OSError:
        return None
    if process.returncode is not None:
        os.close(fd)
        return None
    return fd


def _group_members(pgid: int, uid: int | None) -> list[int]:
    """Pids whose process group is `pgid` and whose real uid is `uid` (any, if None)."""
    members: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            if uid is not None and os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except (OSError, ValueError, IndexError):
            continue
        members.append(pid)
    return members


def kill_group(browser: BrowserProcess) -> None:
    """SIGKILL the browser's process group, never a group that merely reuses its number.

    asyncio reaps the leader as soon as it exits (say, killed by the agent, which shares
    its uid), and its pid may then be given to any process, root's included: a plain
    killpg(pid) later would kill that process's group. So the leader is signalled through
    its pidfd, and every other member through a pidfd of its own, opened and then checked
    to be in the browser's group and of the browser's uid. Without pidfds, the group is
    signalled only while the leader is unreaped (its pid cannot be reused then)."""
    pgid = browser.process.pid
    if browser.pidfd is None:
        if browser.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        return
    try:
        signal.pidfd_send_signal(browser.pidfd, signal.SIGKILL)
        leader_was_there = True  # unreaped: its pid, the group's number, was ours
    except OSError:
        leader_was_there = False
    uid = browser.identity.uid if browser.identity.uid is not None else os.getuid()
    if not leader_was_there and uid == os.getuid():
        # The group's number may be anyone's by now, and a process of our own uid in it
        # may be one of the server's (a job of exec_remote): leave it.
        return
    for pid in _group_members(pgid, uid):
        if pid == pgid:
            continue  # the leader's pid: signalled through its own pidfd above
        try:
            member = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            # The pidfd pins the process: if it is still in the group, it is ours.
            if pid in _group_members(pgid, uid):
                signal.pidfd_send_signal(member, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(member)


async def stop(browser: BrowserProcess) -> asyncio.Task[None]:
    """Kill the browser's whole process group and reap it; return the task removing its
    profile (in a child process of the browser's identity, off the event loop)."""
    browser.connection.close()
    kill_group(browser)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(browser.process.wait(), 5.0)
    if browser.pidfd is not None:
        os.close(browser.pidfd)
        browser.pidfd = None
    for task in browser.tasks:
        task.cancel()
    return asyncio.create_task(remove_profile(browser.profile_dir, browser.identity))


PROFILE_REMOVAL_TIMEOUT_S = 600.0


def _remove_in_child(path: str, identity: Identity) -> None:
    """In a forked child: become the browser's identity, remove the profile, and exit
    (never returning into the server's code). A profile swapped for a link is left."""
    code = 0
    try:
        if identity.uid is not None and identity.gid is not None:
            os.setgroups(identity.groups or [])
            os.setresgid(identity.gid, identity.gid, identity.gid)
            os.setresuid(identity.uid, identity.uid, identity.uid)
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
    except BaseException:
        code = 1
    os._exit(code)


async def remove_profile(path: str, identity: Identity) -> None:
    """Remove a profile directory as `identity`, in a child process: root never walks a
    tree the agent owns, and a tree of a million files costs that child its time, not
    the server's event loop. rmtree works through directory descriptors and never
    follows a link the browser's user may have planted (shutil.rmtree.avoids_symlink_attacks).

    A plain fork, not a subprocess: a frozen runtime has no interpreter to exec, and
    Popen's preexec_fn would hold the server until the child finished."""
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        _remove_in_child(path, identity)  # never returns
    try:
        if await _reaped(pid, PROFILE_REMOVAL_TIMEOUT_S):
            return
    except asyncio.CancelledError:
        _kill(pid)
        reap = asyncio.ensure_future(_reaped(pid, KILLED_REAP_S))
        _REAPING.add(reap)  # the loop holds tasks weakly: kept here until it is done
        reap.add_done_callback(_REAPING.discard)
        raise
    _kill(pid)
    await _reaped(pid, KILLED_REAP_S)
    raise asyncio.TimeoutError(f"removing {path} took longer than {PROFILE_REMOVAL_TIMEOUT_S:g} s")


KILLED_REAP_S = 10.0
_REAPING: set[asyncio.Future[bool]] = set()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def _reaped(pid: int, timeout: float) -> bool:
    """Wait for our child `pid` to end and reap it, polling without blocking: no thread
    waits on it, so children the agent stops (SIGSTOP, as their uid) cannot take the
    thread pool that page rendering needs. False if it still runs after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.005
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG never blocks)
        except ChildProcessError:
            return True  # reaped already
        if done:
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def browser_version(executable: str, timeout: float) -> str | None:
    """`<browser> --version` for a browser that is not running, or None."""
    try:
        process = await asyncio.create_subprocess_exec(
            executable,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return None
    return out.decode(errors="replace").strip()[:200] or None
