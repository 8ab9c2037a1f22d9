"""The web browser against the attacks of an outside review: a browser pid reused after
the agent killed its browser, forged DevTools frames, a profile of many files, pages that
hang, spin or trap their unload, a browser killed mid-load, identities that differ only
in their groups (THREAT_MODEL.md, "The web browser"). Real Chromium, real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.server
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.runtime.jsonrpc import ToolError
from sandbox_tools.runtime.limits import DEFAULT_BROWSER, Limits
from sandbox_tools.runtime.tools.web_browser.cdp import BrowserFailed
from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
from sandbox_tools.runtime.tools.web_browser.tool_types import (
    ClickParams,
    ScrollParams,
    SessionParams,
)
from tests.support import RuntimeDir, browse, eventually, new_browser_session, serve_site

pytestmark = [
    pytest.mark.skipif(
        not os.access(DEFAULT_BROWSER, os.X_OK),
        reason=f"no browser at {DEFAULT_BROWSER}: run scripts/setup.sh (chromium-headless-shell)",
    ),
    pytest.mark.security,
]
PR_SET_CHILD_SUBREAPER = 36
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as uid 1000 needs root")

PAGES = {
    "/": "<!doctype html><title>Home</title><main><h1>Welcome</h1></main>",
    "/spin": "<!doctype html><title>Spin</title><main><h1>Spinning</h1></main>"
    "<script>setTimeout(() => { while (true) {} }, 200)</script>",
    "/unload": "<!doctype html><title>Trap</title><main><button>Press</button></main><script>"
    "addEventListener('beforeunload', e => { e.preventDefault(); e.returnValue = 'stay'; });"
    "</script>",
}


class _Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/hang":  # accepts, never answers
            time.sleep(60)
            return
        if self.path == "/trickle":  # headers at once, the body a byte at a time
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            try:
                self.wfile.write(b"<!doctype html><title>Slow</title><main><p>")
                for _ in range(60):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.5)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        data = PAGES.get(self.path, PAGES["/"]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with serve_site(_Site) as url:
        yield url


@pytest.fixture
async def short() -> AsyncIterator[WebBrowserController]:
    """A controller whose commands and loads time out after 4 s."""
    controller = WebBrowserController(Limits(browser_call_timeout_s=4.0))
    yield controller
    await controller.shutdown()


def profile_of(pid: int) -> str:
    arguments = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    return next(a.split("=", 1)[1] for a in arguments if a.startswith("--user-data-dir="))


class LoopStall:
    """The longest the event loop went without running a 10 ms ticker."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._last = time.monotonic()
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self._note()

    def _note(self) -> None:
        now = time.monotonic()
        self.longest = max(self.longest, now - self._last - 0.01)
        self._last = now

    def stop(self) -> float:
        self._note()  # a stall that is still going on, too
        self._task.cancel()
        return self.longest


def reap_orphans(pgid: int) -> None:
    """Reap the killed members of `pgid` this process adopted as a subreaper (the
    container's init may never reap them, and a zombie keeps its group's number)."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and int(fields[1]) == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(name), 0)


def reuse_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A root process leading its own group, given `pid` (through ns_last_pid)."""
    for _ in range(200):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
        if victim.pid == pid:
            return victim
        victim.kill()
        victim.wait()
    return None


@needs_root
@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="ns_last_pid is not writable"
)
async def test_a_browser_pid_reused_after_the_agent_killed_it_is_never_signalled(
    site: str,
) -> None:
    """THREAT_MODEL.md, "The web browser" (a browser that crashes, hangs or is killed:
    its group is killed): only the browser's own processes, never a group that got its
    pid after the agent killed the browser and the server reaped it."""
    controller = WebBrowserController(Limits())
    victim = None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # to reap the killed renderers
    try:
        session = await new_browser_session(controller, user="1000")
        await browse(controller, session, site)
        browser = controller._browser
        assert browser is not None
        pid = browser.pid
        os.killpg(pid, signal.SIGKILL)  # as the agent (uid 1000) may
        for _ in range(100):
            if browser.process.returncode is not None and not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        reap_orphans(pid)
        victim = reuse_pid(pid)
        if victim is None:
            pytest.skip("the pid was not given again")
        await controller.shutdown()  # stops the dead browser: the old code killpg'd pid
        await asyncio.sleep(0.2)
        assert victim.poll() is None, "the server killed a process that reused the pid"
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        await controller.shutdown()
        if victim is not None:
            victim.kill()
            victim.wait()


async def test_forged_frames_are_bounded_before_they_are_parsed(site: str) -> None:
    """THREAT_MODEL.md, "The web browser" (what the browser says is untrusted): a dense
    event of 30 MB written into the pipe (as anything of the browser's uid can) is
    dropped unparsed, the event loop is not held, and the session goes on."""
    controller = WebBrowserController(Limits())
    try:
        session = await new_browser_session(controller)
        await browse(controller, session, site)
        pid = (await controller.info())["pid"]
        assert isinstance(pid, int)
        frame = b'{"method":"Page.x","params":{"a":[' + b"[]," * (10 * 1024 * 1024) + b"[]]}}\0"
        fd = os.open(f"/proc/{pid}/fd/4", os.O_WRONLY)
        stall = LoopStall()
        await asyncio.sleep(0.1)
        try:
            await asyncio.to_thread(os.write, fd, frame)  # a pipe write blocks until read
            await asyncio.to_thread(os.write, fd, frame)
            await asyncio.sleep(0.5)
        finally:
            os.close(fd)
        longest = stall.stop()
        assert longest < 0.5, f"the event loop stalled {longest:.2f} s on a forged frame"
        result = await controller.scroll(
            ScrollParams.parse({"session_name": session, "direction": "down"})
        )
        assert result["error"] is None
        assert (await controller.info())["pid"] == pid
    finally:
        await controller.shutdown()


@needs_root
async def test_a_profile_of_many_files_is_removed_off_the_event_loop(site: str) -> None:
    """THREAT_MODEL.md, "The web browser" (a private profile, removed when the browser
    stops): a profile the agent filled with 30,000 files is removed by a child process
    of the browser's identity, while the server's loop goes on."""
    controller = WebBrowserController(Limits())
    try:
        session = await new_browser_session(controller, user="1000")
        await browse(controller, session, site)
        pid = (await controller.info())["pid"]
        assert isinstance(pid, int)
        profile = profile_of(pid)
        fill = (
            "import os, sys\n"
            "d = os.path.join(sys.argv[1], 'junk'); os.mkdir(d)\n"
            "for i in range(30):\n"
            "    s = os.path.join(d, str(i)); os.mkdir(s)\n"
            "    for j in range(1000): os.close(os.open(os.path.join(s, str(j)), os.O_CREAT))\n"
        )
        filler = await asyncio.create_subprocess_exec(
            "python3", "-c", fill, profile, user=1000, group=1000, extra_groups=[]
        )
        assert await filler.wait() == 0
        stall = LoopStall()
        await asyncio.sleep(0.1)
        await controller.shutdown()
        longest = stall.stop()
        assert longest < 0.3, f"the event loop stalled {longest:.2f} s removing the profile"
        assert not os.path.exists(profile)
    finally:
        await controller.shutdown()


async def test_a_page_that_hangs_or_spins_is_its_own_error_not_the_browsers(
    short: WebBrowserController, site: str
) -> None:
    """THREAT_MODEL.md, "The web browser" (a page's failure is that page's): a server
    that never answers and a script that never yields cost their own session an error;
    the browser and the other sessions' pages stay."""
    other = await new_browser_session(short)
    assert (await browse(short, other, site))["error"] is None
    pid = (await short.info())["pid"]
    victim = await new_browser_session(short)
    hung = await browse(short, victim, f"{site}/hang")
    assert hung["error"] is not None
    assert (await browse(short, victim, site))["error"] is None  # the hang was stopped
    await browse(short, victim, f"{site}/spin")
    await asyncio.sleep(0.5)
    spun = await short.scroll(ScrollParams.parse({"session_name": victim, "direction": "down"}))
    assert spun["error"] is not None and "did not answer" in spun["error"]
    refreshed = await short.refresh(SessionParams.parse({"session_name": other}))
    assert refreshed["error"] is None and "Welcome" in refreshed["web_at"]
    assert (await short.info())["pid"] == pid  # the same browser throughout
    assert (await browse(short, victim, site))["error"] is None  # the session starts again


async def test_a_beforeunload_trap_does_not_keep_the_page(
    short: WebBrowserController, site: str
) -> None:
    """THREAT_MODEL.md, "The web browser" (dialogs would block every later command): a
    page that asks to stay when left is left all the same."""
    session = await new_browser_session(short)
    page = await browse(short, session, f"{site}/unload")
    button = int(page["web_at"].split("] button")[0].rsplit("[", 1)[1])
    await short.click(ClickParams.parse({"session_name": session, "element_id": button}))
    left = await browse(short, session, f"{site}/next")
    assert left["error"] is None and "Welcome" in left["web_at"]


async def test_a_browser_killed_mid_load_fails_the_call_at_once(site: str) -> None:
    """THREAT_MODEL.md, "The web browser" (a browser that crashes or is killed: a tool
    error): a page still loading hears its browser died when the pipe closes, not at
    the end of the 30 s load wait."""
    controller = WebBrowserController(Limits())
    try:
        session = await new_browser_session(controller)
        await browse(controller, session, site)
        pid = (await controller.info())["pid"]
        assert isinstance(pid, int)
        call = asyncio.create_task(browse(controller, session, f"{site}/trickle"))
        await asyncio.sleep(1.5)
        os.killpg(pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(BrowserFailed):
            await call
        assert time.monotonic() - killed < 5
    finally:
        await controller.shutdown()


@needs_root
async def test_identities_that_differ_only_in_groups_do_not_share_a_browser(
    site: str,
) -> None:
    """THREAT_MODEL.md, "The web browser" (one browser never serves two identities): a
    browser with group 0 must not serve a session of the same uid and gid without it."""
    controller = WebBrowserController(Limits())
    try:
        await new_browser_session(controller, user={"uid": 1000, "gid": 1000, "groups": [1000, 0]})
        with pytest.raises(ToolError, match="cannot also act as"):
            await new_browser_session(controller, user={"uid": 1000, "gid": 1000, "groups": [1000]})
    finally:
        await controller.shutdown()


def test_profiles_a_killed_server_left_are_removed_by_the_next_server(
    tmp_path: Path, site: str
) -> None:
    """THREAT_MODEL.md, "The web browser" (a private profile, removed when the browser
    stops): a server killed with SIGKILL cannot remove its browser's profile; the next
    server does, from the list it keeps in its directory."""
    runtime = RuntimeDir(str(tmp_path / "server"))
    try:
        name = runtime.result("web_new_session", {"headful": False})["session_name"]
        assert runtime.result("web_go", {"session_name": name, "url": site})["error"] is None
        pid = runtime.result("browser_info")["pid"]
        profile = profile_of(pid)
        server = runtime.server_pid()
        assert server is not None
        os.kill(server, signal.SIGKILL)
        eventually(lambda: not os.path.exists(f"/proc/{pid}/cmdline"), "the browser to exit")
        assert os.path.isdir(profile)  # nobody removed it
        runtime.result("version")  # the next server
        eventually(lambda: not os.path.exists(profile), "the leftover profile to be removed")
    finally:
        runtime.cli("stop-server")


async def test_profile_removals_the_agent_stops_never_take_the_thread_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THREAT_MODEL.md rule 6 (the runtime never wedges): each browser stop removes its
    profile in a child of the browser's uid, which the agent (that uid) can SIGSTOP.
    A thread once waited on each; six stopped children filled the pool page rendering
    needs and every web_* call hung. Now no thread waits on them: with 20 stopped
    removals pending, the pool answers at once; their end kills and reaps them all."""
    from sandbox_tools.runtime.identity import Identity
    from sandbox_tools.runtime.tools.web_browser import browser as chromium

    def stop_instead_of_removing(path: str, identity: Identity) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)  # what the agent does to the child
        os._exit(0)

    def children() -> set[str]:  # zombies included: a child not reaped is still listed
        mine = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                stat_line = Path(f"/proc/{pid}/stat").read_text()
                if int(stat_line.rsplit(")", 1)[1].split()[1]) == os.getpid():
                    mine.append(pid)
        return set(mine)

    before = children()
    monkeypatch.setattr(chromium, "_remove_in_child", stop_instead_of_removing)
    myself = Identity(uid=None, gid=None, groups=None, home=None, name=None)
    removals = [
        asyncio.create_task(chromium.remove_profile(str(tmp_path / f"p{n}"), myself))
        for n in range(20)
    ]
    await asyncio.sleep(0.5)
    started = time.monotonic()
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 5) == 42
    assert time.monotonic() - started < 1
    assert not any(task.done() for task in removals)
    for task in removals:
        task.cancel()
    await asyncio.gather(*removals, return_exceptions=True)
    for _ in range(200):  # the reaps run on this loop: let them
        if children() == before:
            break
        await asyncio.sleep(0.05)
    assert children() == before, "a stopped removal child was left unreaped"


def test_a_profile_is_never_made_where_another_user_could_swap_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THREAT_MODEL.md rule 1: the image sets TMPDIR for the runtime too. Pointed at a
    directory the agent (uid 1000) owns, a root browser's profile was made there, the
    agent swapped it for a link, and root's Chromium wrote through it. Profiles go only
    where nobody but root and the runtime's user can change anything on the path."""
    from sandbox_tools.runtime.paths import safe_for_us
    from sandbox_tools.runtime.tools.web_browser import browser as chromium

    agents = tmp_path / "agents"
    agents.mkdir()
    os.chown(agents, 1000, 1000)
    monkeypatch.setattr("tempfile.tempdir", str(agents))
    assert chromium.profile_base() == "/tmp"

    ours = tmp_path / "ours"  # root's, 0755, under pytest's root-owned tmp
    ours.mkdir(mode=0o755)
    monkeypatch.setattr("tempfile.tempdir", str(ours))
    if safe_for_us(str(tmp_path)) is not None:
        assert chromium.profile_base() == str(ours)
    (ours / "inner").mkdir()
    ours.chmod(0o777)  # writable by others, not sticky: unsafe below it too
    monkeypatch.setattr("tempfile.tempdir", str(ours / "inner"))
    assert chromium.profile_base() == "/tmp"
