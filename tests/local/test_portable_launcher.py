"""The static launcher and the packer, for real: compiled with musl-gcc, run here."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox_tools.build_containers.lock import RESOURCES
from sandbox_tools.build_containers.package import (
    TRAILER,
    TRAILER_MAGIC,
    _entry,
    build_archive,
    checksum,
    compress,
    pack_portable,
)
from tests.support import oversized_request_then_one

LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}[os.uname().machine]
TREE_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The launcher built as the builder builds it; only the tests that run it need musl
    (the ones that read its source or the packer's output run everywhere)."""
    if shutil.which("musl-gcc") is None:
        pytest.skip("needs musl-tools")
    out = tmp_path_factory.mktemp("launcher") / "launcher"
    subprocess.run(
        ["musl-gcc", "-static", "-Os", "-o", str(out), str(RESOURCES / "launcher.c")], check=True
    )
    return out


def fake_tree(root: Path) -> Path:
    """A tree whose 'loader' is a script that prints what it was started with."""
    (root / "lib").mkdir(parents=True)
    (root / "_internal" / "pkg").mkdir(parents=True)
    loader = root / "lib" / LOADER
    loader.write_text(
        '#!/bin/sh\necho "args: $*"\necho "archive: $_PYI_ARCHIVE_FILE"\n'
        'echo "level: $_PYI_PARENT_PROCESS_LEVEL"\necho "self: $SANDBOX_TOOLS_SELF"\n'
    )
    loader.chmod(0o755)
    (root / "runtime").write_bytes(b"\x7fELF fake bootloader")
    (root / "_internal" / "pkg" / "data.bin").write_bytes(os.urandom(300_000) * 3)
    # LZ4 matches of both kinds: overlapping their copy (runs) and apart from it (repeats).
    block = os.urandom(1000)
    repeats = b"".join(block + bytes([n]) * n + os.urandom(n) for n in range(1, 200))
    (root / "_internal" / "pkg" / "repeats.bin").write_bytes(repeats)
    (root / "_internal" / "link").symlink_to("pkg/data.bin")
    return root


def test_unpacks_once_and_runs_the_bundled_loader(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)

    out = subprocess.run([str(artifact), "healthcheck", "x y"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    unpacked = install / f"runtime-{TREE_ID}"
    lines = out.stdout.splitlines()
    assert lines[0] == (
        f"args: --library-path {unpacked}/lib:{unpacked}/_internal "
        f"--inhibit-cache --argv0 {unpacked}/runtime {unpacked}/runtime "
        "healthcheck x y"
    )
    assert lines[1:] == [f"archive: {unpacked}/runtime", "level: -1", f"self: {artifact}"]
    assert (unpacked / "_internal" / "pkg" / "data.bin").read_bytes() == (
        tree / "_internal" / "pkg" / "data.bin"
    ).read_bytes()
    assert os.readlink(unpacked / "_internal" / "link") == "pkg/data.bin"
    assert oct((unpacked / "lib" / LOADER).stat().st_mode & 0o777) == oct(0o755)
    assert oct((unpacked / "runtime").stat().st_mode & 0o777) == oct(0o644)

    # Second start: nothing is unpacked again (the tree keeps its inode).
    inode = (unpacked / "_internal" / "pkg" / "data.bin").stat().st_ino
    subprocess.run([str(artifact), "version"], check=True, capture_output=True)
    assert (unpacked / "_internal" / "pkg" / "data.bin").stat().st_ino == inode
    assert sorted(p.name for p in install.iterdir()) == [
        ".unpack.lock",
        "runtime-" + TREE_ID,
        "sandbox-tools",
    ]


def test_concurrent_first_runs_unpack_one_tree(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    with ThreadPoolExecutor(10) as pool:
        results = list(
            pool.map(lambda _: subprocess.run([str(artifact), "x"], capture_output=True), range(10))
        )
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".unpack.lock",
        "runtime-" + TREE_ID,
        "sandbox-tools",
        "tree",
    ]  # no staging directory left behind


def test_corrupted_payload_is_refused_and_leaves_no_tree(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    data = bytearray(artifact.read_bytes())
    middle = launcher.stat().st_size + (len(data) - launcher.stat().st_size - TRAILER.size) // 2
    data[middle] ^= 0xFF
    artifact.write_bytes(bytes(data))
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "corrupted" in out.stderr
    assert not (install / f"runtime-{TREE_ID}").exists()

    truncated = install / "truncated"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    truncated.chmod(0o755)
    out = subprocess.run([str(truncated), "version"], capture_output=True, text=True)
    assert out.returncode != 0 and "sandbox-tools artifact" in out.stderr


def test_exec_answers_parse_errors_without_python(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    out = subprocess.run([str(artifact), "exec", "  \n "], capture_output=True, text=True)
    assert out.returncode == 0
    assert '"code":-32700' in out.stdout


def test_archive_is_deterministic(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    first = build_archive(tree)
    os.utime(tree / "runtime", (0, 0))  # timestamps are not part of the archive
    assert build_archive(tree) == first


# -- hostile payloads (THREAT_MODEL.md: "the launcher treats its own payload as hostile
#    input too"). The archives are written entry by entry, as the packer never would.


def pack_raw(launcher: Path, archive: bytes, output: Path) -> None:
    head = launcher.read_bytes()
    payload = compress(archive)
    trailer = TRAILER.pack(
        TRAILER_MAGIC, len(head), len(payload), len(archive), checksum(archive), TREE_ID.encode()
    )
    output.write_bytes(head + payload + trailer)
    output.chmod(0o755)


def loader_entries() -> bytes:
    script = b"#!/bin/sh\necho ran\n"
    return (
        _entry(b"D", 0o755, "lib", b"")
        + _entry(b"F", 0o755, f"lib/{LOADER}", script)
        + _entry(b"F", 0o644, "runtime", b"boot")
    )


HOSTILE_ENTRIES = dict(
    [
        ("dot-dot entry", _entry(b"F", 0o644, "../../escaped", b"x")),
        ("absolute entry", _entry(b"F", 0o644, "/tmp/escaped-absolute", b"x")),
        ("empty component", _entry(b"F", 0o644, "lib//x", b"x")),
        ("NUL in a name", _entry(b"F", 0o644, "lib/x\x00y", b"x")),
        ("absolute symlink target", _entry(b"L", 0o777, "evil", b"/etc")),
        ("symlink climbing out", _entry(b"L", 0o777, "lib/up", b"../../..")),
        (
            "write through a symlink",  # a relative link inside the tree, then a file under it
            _entry(b"L", 0o777, "inner", b"lib") + _entry(b"F", 0o644, "inner/x", b"x"),
        ),
    ]
)


@pytest.mark.parametrize("name", HOSTILE_ENTRIES)
def test_hostile_archive_entries_are_refused(launcher: Path, tmp_path: Path, name: str) -> None:
    """Rule: confined entry paths; nothing is written outside the staging directory."""
    entries = HOSTILE_ENTRIES[name]
    install = tmp_path / "a" / "b" / "install"
    install.mkdir(parents=True)
    artifact = install / "sandbox-tools"
    pack_raw(launcher, loader_entries() + entries, artifact)
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode == 70, (name, out.stdout, out.stderr)
    assert "refusing" in out.stderr or "symlink" in out.stderr, out.stderr
    assert not (install / f"runtime-{TREE_ID}").exists()
    assert not (tmp_path / "a" / "escaped").exists()
    assert not Path("/tmp/escaped-absolute").exists()
    assert not (install / "lib").exists()  # nothing escaped the staging directory


def test_stale_staging_from_a_crashed_run_is_swept(launcher: Path, tmp_path: Path) -> None:
    """Rule: a random staging name, stale staging cleaned (a restarted container reuses
    pids, so a pid-named leftover once blocked every start)."""
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    stale = install / f"runtime-{TREE_ID}.tmp.123"
    (stale / "lib").mkdir(parents=True)
    (stale / "lib" / "half-written").write_bytes(b"x" * 10)
    out = subprocess.run([str(artifact), "x"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert not stale.exists()
    assert (install / f"runtime-{TREE_ID}" / ".complete").read_text() == TREE_ID


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a tree owned by another user")
def test_existing_tree_of_another_user_is_not_run(launcher: Path, tmp_path: Path) -> None:
    """Rule: an existing tree is checked for owner and mode before anything of it runs."""
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    planted = install / f"runtime-{TREE_ID}"
    shutil.copytree(tree, planted, symlinks=True)
    (planted / ".complete").write_text(TREE_ID)
    (planted / "lib" / LOADER).write_text("#!/bin/sh\necho planted-loader-ran\n")
    for path in [planted, *planted.rglob("*")]:
        os.lchown(path, 1000, 1000)
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode == 70 and "refusing to run it" in out.stderr, out.stderr
    assert "planted-loader-ran" not in out.stdout
    # Owned by us but writable by others: refused as well.
    for path in [planted, *planted.rglob("*")]:
        os.lchown(path, 0, 0)
    planted.chmod(0o777)
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode == 70 and "refusing to run it" in out.stderr, out.stderr


def test_unpack_subcommand_unpacks_without_running_anything(launcher: Path, tmp_path: Path) -> None:
    tree = fake_tree(tmp_path / "tree")
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    out = subprocess.run([str(artifact), "unpack"], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "")
    assert (tmp_path / f"runtime-{TREE_ID}" / ".complete").exists()


# -- `verify`: an existing tree against the payload (THREAT_MODEL.md, rule 2: the image
#    may ship the genuine, public executable beside a tree of its own making).

PLANTED_RAN = "planted-ran"


def verified(artifact: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(artifact), "verify"], capture_output=True, text=True, timeout=30)


def unpacked_install(launcher: Path, tmp_path: Path) -> tuple[Path, Path]:
    """An artifact of the fake tree, unpacked by its own first run; (artifact, tree)."""
    install = tmp_path / "install"
    install.mkdir()
    artifact = install / "sandbox-tools"
    pack_portable(launcher, fake_tree(tmp_path / "tree"), TREE_ID, artifact)
    assert subprocess.run([str(artifact), "unpack"], capture_output=True).returncode == 0
    return artifact, install / f"runtime-{TREE_ID}"


def replace_loader(tree: Path) -> None:
    """What the image ships: the loader a script that leaves a mark when it runs."""
    loader = tree / "lib" / LOADER
    loader.unlink()
    loader.write_text(f"#!/bin/sh\ntouch {tree.parent}/{PLANTED_RAN}\n")
    loader.chmod(0o755)


def change_a_byte(tree: Path) -> None:
    data = tree / "_internal" / "pkg" / "data.bin"
    content = data.read_bytes()
    data.write_bytes(bytes([content[0] ^ 0xFF]) + content[1:])  # always another byte


def add_a_file(tree: Path) -> None:
    (tree / "_internal" / "pkg" / "sitecustomize.py").write_text("import os\n")


def add_a_link(tree: Path) -> None:
    (tree / "lib" / "extra-link").symlink_to("/etc")


def retarget_the_link(tree: Path) -> None:
    (tree / "_internal" / "link").unlink()
    (tree / "_internal" / "link").symlink_to("/etc/passwd")


def swap_a_file_for_a_link(tree: Path) -> None:
    (tree / "runtime").rename(tree / "moved")
    (tree / "runtime").symlink_to("moved")


def swap_a_file_for_a_fifo(tree: Path) -> None:
    (tree / "runtime").unlink()
    os.mkfifo(tree / "runtime")


def swap_the_tree_for_a_link(tree: Path) -> None:
    tree.rename(tree.with_name("elsewhere"))
    tree.symlink_to("elsewhere")


TAMPERINGS: dict[str, tuple[Callable[[Path], object], str]] = {
    # what the image does to the tree -> how `verify` names the difference
    "loader replaced": (replace_loader, f"lib/{LOADER} differs from the payload: another"),
    "one byte changed": (change_a_byte, "pkg/data.bin differs from the payload: another content"),
    "a file added": (add_a_file, "pkg/sitecustomize.py differs from the payload: not in the"),
    "a link added": (add_a_link, "lib/extra-link differs from the payload: not in the payload"),
    "a file missing": (
        lambda t: (t / "runtime").unlink(),
        "runtime differs from the payload: missing",
    ),
    "a link retargeted": (
        retarget_the_link,
        "_internal/link differs from the payload: another link",
    ),
    "a file swapped for a link": (
        swap_a_file_for_a_link,
        "runtime differs from the payload: not a regular",
    ),
    "a FIFO for a file": (
        swap_a_file_for_a_fifo,
        "runtime differs from the payload: not a regular file",
    ),
    "a directory made writable": (
        lambda t: (t / "_internal" / "pkg").chmod(0o777),
        "_internal/pkg differs from the payload: mode 0777, not 0755",
    ),
    "a file made setuid": (
        lambda t: (t / "lib" / LOADER).chmod(0o4755),
        f"lib/{LOADER} differs from the payload: mode 4755, not 0755",
    ),
    "the marker of another build": (
        lambda t: (t / ".complete").write_text("f" * 32),
        ".complete differs from the payload: not this build's marker",
    ),
    "the tree a link": (swap_the_tree_for_a_link, "/. differs from the payload: not a directory"),
}


def test_verify_accepts_the_tree_it_unpacked_and_a_tree_not_there_yet(
    launcher: Path, tmp_path: Path
) -> None:
    artifact, tree = unpacked_install(launcher, tmp_path)
    out = verified(artifact)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    shutil.rmtree(tree)
    out = verified(artifact)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert not tree.exists()  # `verify` unpacks nothing: the next run does


@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_verify_names_the_first_difference_and_runs_nothing_of_the_tree(
    launcher: Path, tmp_path: Path, tampering: str
) -> None:
    """Rule 2: a tree that is not exactly the payload is refused before anything of it
    runs; the check reads no FIFO (it would hang), follows no link and starts nothing."""
    artifact, tree = unpacked_install(launcher, tmp_path)
    change, named = TAMPERINGS[tampering]
    change(tree)
    out = verified(artifact)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert named in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "install" / PLANTED_RAN).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give an entry another owner")
def test_verify_refuses_an_entry_of_another_owner_or_with_capabilities(
    launcher: Path, tmp_path: Path
) -> None:
    """Rule 2: the tree is root's, one file in it another user's (who could change it
    after the check); then a file with file capabilities (more rights when it runs)."""
    artifact, tree = unpacked_install(launcher, tmp_path)
    os.lchown(tree / "runtime", 1000, 1000)
    out = verified(artifact)
    assert out.returncode == 1 and "runtime differs from the payload: owned by uid 1000" in (
        out.stderr
    ), out.stderr
    os.lchown(tree / "runtime", 0, 0)
    assert verified(artifact).returncode == 0
    capability = struct.pack("<5I", 0x02000001, 1 << 10, 0, 0, 0)  # v2, effective: bind
    try:
        os.setxattr(tree / "runtime", "security.capability", capability)
    except OSError as exc:
        pytest.skip(f"this file system takes no file capabilities: {exc}")
    out = verified(artifact)
    assert out.returncode == 1 and "carries file capabilities" in out.stderr, out.stderr


ECHO_SERVER = """#!/usr/bin/env python3
# Stands in for the bundled loader: `... server --dir D` serves D/server.sock and answers
# each request line with the number of bytes it carried.
import fcntl, json, os, socket, sys
directory = sys.argv[sys.argv.index("--dir") + 1]
lock = open(os.path.join(directory, "server.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
server = socket.socket(socket.AF_UNIX)
open(os.path.join(directory, "server.pid"), "w").write(str(os.getpid()))
server.bind(os.path.join(directory, "server.sock"))
server.listen()
while True:
    connection, _ = server.accept()
    buffer, data = b"", b""
    while not data:  # option lines ("#cwd ...") come first; the request is the next line
        while b"\\n" not in buffer:
            chunk = connection.recv(1 << 20)
            if not chunk:
                break
            buffer += chunk
        line, _, buffer = buffer.partition(b"\\n")
        if not line.startswith(b"#"):
            data = line + b"\\n"
    request = json.loads(data)
    if "id" in request:  # like the real server: a notification gets no response
        answer = {"jsonrpc": "2.0", "id": request["id"], "result": len(data)}
        connection.sendall(json.dumps(answer).encode() + b"\\n")
    else:
        while connection.recv(1 << 16):  # until the client half-closes
            pass
    connection.close()
"""


def echo_server_artifact(launcher: Path, tmp_path: Path, loader: str = ECHO_SERVER) -> Path:
    """An artifact whose bundled 'loader' is the script `loader` (the runtime's stand-in)."""
    tree = tmp_path / "tree"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / LOADER).write_text(loader)
    (tree / "lib" / LOADER).chmod(0o755)
    (tree / "runtime").write_bytes(b"boot")
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    return artifact


def kill_echo_server(tmp_path: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((tmp_path / "run" / "server.pid").read_text()), signal.SIGKILL)


@pytest.mark.parametrize("size", [65_533, 65_534, 65_535, 70_000, 1_000_000])
def test_exec_forwards_requests_of_any_size(launcher: Path, tmp_path: Path, size: int) -> None:
    """Requests of 65,534 bytes and more once failed with -32700: the read loop took a
    zero-byte read for EOF. Every byte must reach the server."""
    artifact = echo_server_artifact(launcher, tmp_path)
    head = '{"jsonrpc":"2.0","id":7,"method":"version","params":{"pad":"'
    request = head + "x" * (size - len(head) - 3) + '"}}'
    assert len(request) == size
    env = {**os.environ, "SANDBOX_TOOLS_DIR": str(tmp_path / "run")}
    try:
        out = subprocess.run(
            [str(artifact), "exec"],
            input=request,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert out.returncode == 0
        assert out.stdout == f'{{"jsonrpc": "2.0", "id": 7, "result": {size + 1}}}\n', out.stdout
    finally:
        kill_echo_server(tmp_path)


def test_a_notification_through_exec_is_delivered_and_answered_with_nothing(
    launcher: Path, tmp_path: Path
) -> None:
    """A request without an id gets no response from the server; the launcher used to
    wait for one forever. It half-closes, so the server's close ends the wait, and prints
    nothing, exit 0 (inspect_ai's exec_notification takes any output for a failure)."""
    artifact = echo_server_artifact(launcher, tmp_path)
    env = {**os.environ, "SANDBOX_TOOLS_DIR": str(tmp_path / "run")}
    try:
        out = subprocess.run(
            [str(artifact), "exec", '{"jsonrpc":"2.0","method":"version"}'],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert (out.returncode, out.stdout) == (0, "")
    finally:
        kill_echo_server(tmp_path)


@pytest.mark.parametrize(
    ("request_text", "echoed"),
    [
        ('{"jsonrpc":"2.0","id":7,"method":"version"}', 7),
        ('{"params":{"id":5},"jsonrpc":"2.0", "id" : "abc-1" ,"method":"version"}', "abc-1"),
        ('{"jsonrpc":"2.0","id":"a\\"b","method":"version"}', None),  # escapes: not echoed
        ('{"jsonrpc":"2.0","method":"version","params":{"id":3}}', None),
        ('{"jsonrpc":"2.0","id":[1],"method":"version"}', None),
        ('{"jsonrpc":"2.0","id":-12,"method":"version"}', -12),
        ('{"jsonrpc":"2.0","id":0,"method":"version"}', 0),
        # Not JSON's integers: echoed as they are, they would make the answer no JSON.
        ('{"jsonrpc":"2.0","id":007,"method":"version"}', None),
        ('{"jsonrpc":"2.0","id":-,"method":"version"}', None),
        ('{"jsonrpc":"2.0","id":-0a,"method":"version"}', None),
    ],
)
def test_launcher_errors_echo_the_request_id(
    launcher: Path, tmp_path: Path, request_text: str, echoed: object
) -> None:
    """The launcher's own error responses said "id": null while the Python CLI echoed the
    id: a client matching responses by id could not tell what failed."""
    artifact = tmp_path / "sandbox-tools"
    pack_portable(launcher, fake_tree(tmp_path / "tree"), TREE_ID, artifact)
    env = {**os.environ, "SANDBOX_TOOLS_DIR": str(tmp_path / ("d" * 120))}  # too long: refused
    out = subprocess.run(
        [str(artifact), "exec", request_text], capture_output=True, text=True, env=env
    )
    response = json.loads(out.stdout)
    assert response["id"] == echoed and "too long" in response["error"]["message"], response


STDIO_SERVER = """#!/usr/bin/env python3
# Stands in for the runtime server (`server --dir D`): takes D's server lock, listens on
# D/server.sock and answers each request line on its own thread, after the "delay" its
# params ask for, with its method, this server's pid and the options the connection
# sent first; "die" ends the whole server at once. Lines that are no JSON get -32700.
import fcntl, json, os, socket, sys, threading, time
directory = sys.argv[sys.argv.index("--dir") + 1]
lock = open(os.path.join(directory, "server.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
server = socket.socket(socket.AF_UNIX)
server.bind(os.path.join(directory, "server.sock"))
open(os.path.join(directory, "server.pid"), "w").write(str(os.getpid()))
server.listen()

def serve(connection):
    out, options, repliers = threading.Lock(), [], []

    def answer(message):
        with out:
            connection.sendall(json.dumps(message).encode() + b"\\n")

    def reply(request):
        time.sleep(request.get("params", {}).get("delay", 0))
        result = {"method": request["method"], "pid": os.getpid(), "options": options}
        answer({"jsonrpc": "2.0", "id": request["id"], "result": result})

    for line in connection.makefile("rb"):
        if line.startswith(b"#"):
            options.append(line.decode().rstrip("\\n"))
            continue
        try:
            request = json.loads(line)
        except ValueError:
            answer({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "no"}})
            continue
        if request.get("method") == "die":
            os._exit(1)
        if request.get("method") == "half":  # half an answer, then the server dies
            time.sleep(request["params"].get("delay", 0))
            with out:
                connection.sendall(b'{"jsonrpc": "2.0", "id": "half", "result": "' + b"a" * 100000)
            os._exit(1)
        if request.get("method") == "big":  # one line of `size` bytes, ended or not
            size, ended = request["params"]["size"], request["params"].get("ended", True)
            head = b'{"jsonrpc": "2.0", "id": %d, "result": "' % request["id"]
            with out:
                connection.sendall(head)
                for _ in range(size >> 20):
                    connection.sendall(b"a" * (1 << 20))
                connection.sendall(b'"}\\n' if ended else b"")
            if not ended:
                time.sleep(60)
            continue
        if "id" in request:
            repliers.append(threading.Thread(target=reply, args=(request,)))
            repliers[-1].start()
    for thread in repliers:  # the client half-closed: answer what came, then close
        thread.join()
    connection.close()

while True:
    threading.Thread(target=serve, args=(server.accept()[0],)).start()
"""


def request(method: str, request_id: object = None, **params: object) -> str:
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return json.dumps(message) + "\n"


class Bridge:
    """`stdio` of an artifact whose server is STDIO_SERVER, as the host drives it."""

    def __init__(self, launcher: Path, tmp_path: Path) -> None:
        self.artifact = echo_server_artifact(launcher, tmp_path, loader=STDIO_SERVER)
        self.run_dir = tmp_path / "run"
        self.env = {**os.environ, "SANDBOX_TOOLS_DIR": str(self.run_dir)}

    def start(self, cwd: Path | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.artifact), "stdio"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=cwd,
        )

    def server_pid(self) -> int:
        return int((self.run_dir / "server.pid").read_text())

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            os.kill(self.server_pid(), signal.SIGKILL)


@pytest.fixture
def bridge(launcher: Path, tmp_path: Path) -> Iterator[Bridge]:
    made = Bridge(launcher, tmp_path)
    yield made
    made.stop()


def test_stdio_relays_both_ways_in_any_order_without_python(bridge: Bridge, tmp_path: Path) -> None:
    """The bridge is the launcher itself: requests go to the server as they come (a blank
    line is skipped, the last one needs no newline), answers come back as they are
    ready, and the connection first says where the caller is."""
    lines = (
        request("slow", 1, delay=0.5)
        + "\n  \n"
        + "garbage\n"
        + request("fast", "two")
        + request("notified")
        + request("last", 3).rstrip("\n")
    )
    done = subprocess.run(
        [str(bridge.artifact), "stdio"],
        input=lines,
        capture_output=True,
        text=True,
        env=bridge.env,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers[:1]] == [None] and answers[0]["error"]["code"] == -32700
    assert sorted(str(a["id"]) for a in answers[1:3]) == ["3", "two"]
    assert answers[3]["id"] == 1 and len(answers) == 4  # the slow one, after the half-close
    assert answers[3]["result"]["options"] == [f"#cwd {tmp_path}"]
    assert (bridge.run_dir.stat().st_mode & 0o777) == 0o700


def test_a_lost_server_answers_what_waited_and_the_next_request_starts_another(
    bridge: Bridge,
) -> None:
    """The server dies with requests waiting: each gets an error naming the loss (not
    silence), the host hears that its subscriptions are gone, and the next request
    starts a fresh server, on the same channel."""
    channel = bridge.start()
    assert channel.stdin is not None and channel.stdout is not None
    try:
        channel.stdin.write(request("first", 1))
        channel.stdin.flush()
        first = json.loads(channel.stdout.readline())
        channel.stdin.write(request("waits", 2, delay=30) + request("waits", '"x\\"y"', delay=30))
        channel.stdin.write(request("die", 3))
        channel.stdin.flush()
        lost = json.loads(channel.stdout.readline())
        assert lost["id"] == 2 and lost["error"]["code"] == -32098, lost
        assert "connection to the runtime server was lost" in lost["error"]["message"]
        assert lost["error"]["data"] == "connection to the runtime server was lost"
        # The die request itself had an id: it is answered as lost too.
        again = json.loads(channel.stdout.readline())
        assert again["id"] == 3 and again["error"]["code"] == -32098
        note = json.loads(channel.stdout.readline())
        assert note == {
            "jsonrpc": "2.0",
            "method": "runtime_server_lost",
            "params": {"reason": "connection to the runtime server was lost"},
        }
        channel.stdin.write(request("after", 4))
        channel.stdin.flush()
        after = json.loads(channel.stdout.readline())
        assert after["id"] == 4 and after["result"]["pid"] != first["result"]["pid"]
    finally:
        channel.stdin.close()
        assert channel.wait(timeout=30) == 0
    # An id the bridge cannot echo exactly (an escaped string) was never answered twice.
    assert channel.stdout.read() == ""


def test_a_server_directory_removed_underneath_is_made_again(bridge: Bridge) -> None:
    """A tmp cleaner took the server directory and its server died: the channel says
    so, and its next request makes the directory again (private) and starts a server."""
    channel = bridge.start()
    assert channel.stdin is not None and channel.stdout is not None
    try:
        channel.stdin.write(request("first", 1))
        channel.stdin.flush()
        first = json.loads(channel.stdout.readline())["result"]["pid"]
        shutil.rmtree(bridge.run_dir)
        os.kill(first, signal.SIGKILL)
        assert json.loads(channel.stdout.readline())["method"] == "runtime_server_lost"
        channel.stdin.write(request("second", 2))
        channel.stdin.flush()
        second = json.loads(channel.stdout.readline())
        assert second["id"] == 2 and second["result"]["pid"] not in (first, None)
        assert (bridge.run_dir.stat().st_mode & 0o777) == 0o700
    finally:
        channel.stdin.close()
        assert channel.wait(timeout=30) == 0


def test_half_an_answer_of_a_lost_server_never_starts_the_next_answer(bridge: Bridge) -> None:
    """The server died half-way through an answer while the relay was stopped and a new
    request was waiting: the relay found the loss when it sent that request, and the
    half line it had read went before the fresh server's answer (one line of no JSON,
    which failed the host's whole channel). Every line is whole now."""
    channel = bridge.start()
    assert channel.stdin is not None and channel.stdout is not None
    try:
        channel.stdin.write(request("first", 1))
        channel.stdin.flush()
        assert json.loads(channel.stdout.readline())["id"] == 1
        channel.stdin.write(request("half", "half", delay=1))
        channel.stdin.flush()
        time.sleep(0.5)  # sent on; the server answers half of it in half a second
        os.kill(channel.pid, signal.SIGSTOP)
        try:
            time.sleep(1.5)  # half an answer waits in the socket; its server is gone
            channel.stdin.write(request("after", 2))
            channel.stdin.flush()
        finally:
            os.kill(channel.pid, signal.SIGCONT)
        lines = [json.loads(channel.stdout.readline()) for _ in range(3)]
        by_id = {line.get("id"): line for line in lines}
        assert by_id["half"]["error"]["code"] == -32098, lines
        assert by_id[2]["result"]["method"] == "after", lines
        assert any(line.get("method") == "runtime_server_lost" for line in lines), lines
    finally:
        channel.stdin.close()
        assert channel.wait(timeout=30) == 0


def test_a_server_line_past_the_frame_limit_is_a_lost_server_not_held(bridge: Bridge) -> None:
    """An answer that never ends its line (whatever answers on the socket may send one)
    is held up to the frame limit, 64 MiB, then the server is taken as lost: the request
    gets an error and the relay's memory stays bounded. A long answer that ends is
    relayed whole."""
    channel = bridge.start()
    assert channel.stdin is not None and channel.stdout is not None
    try:
        channel.stdin.write(request("big", 1, size=48 << 20))
        channel.stdin.flush()
        answer = channel.stdout.readline()
        assert len(answer) > 48 << 20 and json.loads(answer)["id"] == 1
        channel.stdin.write(request("big", 2, size=200 << 20, ended=False))
        channel.stdin.flush()
        lost = json.loads(channel.stdout.readline())
        assert lost["id"] == 2 and "was lost" in lost["error"]["message"], lost
        status = Path(f"/proc/{channel.pid}/status").read_text()
        rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
        assert rss < 200 * 1024, f"the relay holds {rss} KiB"
    finally:
        channel.stdin.close()
        channel.wait(timeout=30)


def test_twenty_bridges_at_once_start_one_server(bridge: Bridge) -> None:
    def one(_: int) -> int:
        done = subprocess.run(
            [str(bridge.artifact), "stdio"],
            input=request("who", 1),
            capture_output=True,
            text=True,
            env=bridge.env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        pid: int = json.loads(done.stdout)["result"]["pid"]
        return pid

    with ThreadPoolExecutor(20) as pool:
        pids = set(pool.map(one, range(20)))
    assert pids == {bridge.server_pid()}


def test_an_oversized_request_is_answered_once_and_the_channel_goes_on(bridge: Bridge) -> None:
    answers = oversized_request_then_one([str(bridge.artifact), "stdio"], bridge.env, "small")
    assert answers[1]["result"]["method"] == "small"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
def test_a_refused_server_directory_is_every_requests_answer(bridge: Bridge) -> None:
    """The host reads responses, not stderr: each request gets the reason, and nothing
    is started."""
    bridge.run_dir.mkdir(mode=0o700)
    os.chown(bridge.run_dir, 65534, 65534)
    done = subprocess.run(
        [str(bridge.artifact), "stdio"],
        input=request("version", 5) * 2 + request("notified"),
        capture_output=True,
        text=True,
        env=bridge.env,
        timeout=30,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [5, 5], done.stdout
    assert "owned by uid 65534" in answers[0]["error"]["message"]
    assert not (bridge.run_dir / "server.pid").exists()


def test_launcher_constants_agree_with_the_runtime() -> None:
    """The C launcher repeats names, codes and limits of the Python side: every one it
    shares with protocol.py (and the runtime's client) must be spelled as they are."""
    from sandbox_tools import protocol
    from sandbox_tools.runtime import client
    from sandbox_tools.runtime.paths import ServerPaths

    source = (RESOURCES / "launcher.c").read_text()
    defines = dict(
        line.split(None, 2)[1:3]
        for line in source.splitlines()
        if line.startswith("#define ") and len(line.split(None, 2)) == 3
    )

    def c_string(text: str) -> str:
        """`text` as a C string literal spells it (these hold no quote or backslash)."""
        return '"' + text.replace("\n", "\\n") + '"'

    # The environment it shares with the runtime: every variable it names is protocol's.
    shared_env = {
        protocol.SERVER_DIR_ENV,
        protocol.LAUNCHER_SELF_ENV,
        protocol.RESPONSE_MAX_BYTES_ENV,
    }
    named = set(re.findall(r"\b(?:SANDBOX_TOOLS|INSPECT_SANDBOX)_[A-Z0-9_]+\b", source))
    assert named == shared_env
    assert f"getenv({c_string(protocol.SERVER_DIR_ENV)})" in source
    assert f"setenv({c_string(protocol.SERVER_DIR_ENV)}, dir, 1)" in source
    assert f"setenv({c_string(protocol.LAUNCHER_SELF_ENV)}, self_path, 1)" in source
    # The loader's variables it keeps from the runtime, saved where child_env looks.
    from sandbox_tools.runtime.child_env import LOADER_VARIABLES

    listed = ", ".join(c_string(name) for name in LOADER_VARIABLES)
    assert f"LOADER_VARIABLES[] = {{{listed}}};" in source
    assert f'"%s_%s", {c_string(protocol.LAUNCHER_SELF_ENV)}, LOADER_VARIABLES[n]' in source
    lost = c_string(protocol.RUNTIME_SERVER_LOST)
    assert defines["RUNTIME_SERVER_LOST"].split("/*")[0].strip() == lost
    # The large-response exchange: the caller's limit, how long it may be, the option line.
    assert f"getenv({c_string(protocol.RESPONSE_MAX_BYTES_ENV)})" in source
    assert f"limit_len < {protocol.RESPONSE_LIMIT_MAX_DIGITS + 1};" in source
    limit_line = c_string(protocol.RESPONSE_LIMIT_OPTION.decode() + "%s\n")
    assert f"snprintf(option, sizeof option, {limit_line}, limit)" in source
    # The caller's working directory, as its option line.
    cwd_line = c_string(protocol.CWD_OPTION.decode() + "%s\n")
    assert f"snprintf(out, n, {cwd_line}, cwd)" in source
    # Framing, the socket and start timing.
    assert defines["SERVER_START_TIMEOUT_MS"] == str(int(client.SERVER_START_TIMEOUT * 1000))
    factors = re.findall(r"\d+", defines["MAX_REQUEST_BYTES"].split("/*")[0])
    assert math.prod(int(factor) for factor in factors) == protocol.MAX_FRAME_BYTES
    assert protocol.FRAME_TERMINATOR == b"\n" and "request[len++] = '\\n';" in source
    # The server directory's files, as the launcher names them when it starts or finds
    # the server itself.
    paths = ServerPaths("/d")
    assert os.path.basename(paths.socket) == protocol.SOCKET_NAME
    for path in (paths.socket, paths.start_lock, paths.running_lock, paths.log):
        assert f'"%s/{os.path.basename(path)}"' in source
    # Its own JSON-RPC responses: the version, and the runtime's codes for an internal
    # error, a request that is no JSON at all (an empty one) and one too large to read.
    responses = re.findall(r'\{\\"jsonrpc\\":\\"([^\\]*)\\"[^;]*?\\"code\\":(-?\d+),', source)
    assert {version for version, _ in responses} == {protocol.JSONRPC_VERSION}
    assert {int(code) for _, code in responses} == {
        protocol.INTERNAL_ERROR,
        protocol.PARSE_ERROR,
        protocol.INVALID_REQUEST,
    }
    # The installer's check of an unpacked tree before reuse, as the injector names it.
    from sandbox_tools.injector.inject import TREE_CHECK_COMMAND

    assert f'strcmp(argv[1], "{TREE_CHECK_COMMAND}") == 0) verify_tree();' in source
    # The payload trailer it reads is the one the packer writes.
    assert defines["TRAILER_MAGIC"] == f'"{TRAILER_MAGIC.decode()}"'
    assert defines["TRAILER_SIZE"] == str(TRAILER.size)


@pytest.mark.parametrize(
    ("directory_owner", "link_owner", "used"),
    [(1000, 0, False), (0, 0, True), (0, 1000, False)],
    ids=["the-agents-directory", "roots-directory", "the-agents-link-to-roots-directory"],
)
def test_the_server_directory_is_never_where_another_user_could_swap_it(
    launcher: Path, tmp_path: Path, directory_owner: int, link_owner: int, used: bool
) -> None:
    """An image sets TMPDIR to a directory the agent (uid 1000) owns: a root runtime's
    server directory there could be renamed away and replaced by the agent's, so it goes
    to /tmp instead (sticky: nobody else can rename what root made). A TMPDIR only root
    can change is used, by its real path; through a link the agent owns, it is not (the
    agent would point it wherever it likes between two calls)."""
    tree = fake_tree(tmp_path / "tree")
    (tree / "lib" / LOADER).write_text('#!/bin/sh\necho "dir: $SANDBOX_TOOLS_DIR"\n')
    install = tmp_path / "install"
    install.mkdir()
    install.chmod(0o1777)  # others may write (sticky): not the directory beside the executable
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    target = tmp_path / "tmp-target"
    target.mkdir()
    os.chown(target, directory_owner, directory_owner)
    link = tmp_path / "tmp-link"
    link.symlink_to(target)
    os.lchown(link, link_owner, link_owner)
    env = {**os.environ, "TMPDIR": str(link)}
    env.pop("SANDBOX_TOOLS_DIR", None)
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    base = str(target) if used else "/tmp"
    assert out.stdout.strip() == f"dir: {base}/sandbox-tools-{os.geteuid()}-{TREE_ID[:16]}"


def test_the_runtime_never_runs_from_where_another_user_could_swap_its_tree(
    launcher: Path, tmp_path: Path
) -> None:
    """In a directory others may write (not sticky), another user could rename the tree
    away and put one of theirs at its name while it unpacks (their loader ran as root):
    the launcher refuses to unpack or run there, saying so. Nothing is unpacked."""
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "open"
    install.mkdir()
    install.chmod(0o777)
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "can be changed by users other than root" in out.stderr
    assert sorted(p.name for p in install.iterdir()) == ["sandbox-tools"]


def test_the_unpack_never_sweeps_another_users_staging_directory(
    launcher: Path, tmp_path: Path
) -> None:
    """A stale staging directory is swept before unpacking, by path: one another user
    planted (where it may write, as in a sticky /tmp) could be swapped for a link under
    the sweep, and root's files went. Only our own are swept."""
    tree = fake_tree(tmp_path / "tree")
    install = tmp_path / "shared"
    install.mkdir()
    install.chmod(0o1777)
    artifact = install / "sandbox-tools"
    pack_portable(launcher, tree, TREE_ID, artifact)
    planted = install / f"runtime-{TREE_ID}.tmp.AGENT"
    (planted / "d").mkdir(parents=True)
    (planted / "d" / "f").write_text("the agent's")
    for path in (planted, planted / "d", planted / "d" / "f"):
        os.lchown(path, 1000, 1000)
    ours = install / f"runtime-{TREE_ID}.tmp.OURS"
    ours.mkdir()
    out = subprocess.run([str(artifact), "version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (planted / "d" / "f").read_text() == "the agent's"
    assert not ours.exists()
