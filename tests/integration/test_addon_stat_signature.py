"""A later handle's add-on check by the tree's stat signature, in real containers
(THREAT_MODEL.md, "Delivering the add-on": nothing of a tree that does not match the
pinned digest is used).

User path: a later sample in the same container (a new handle, same sandbox object)
opens the browser; the runtime stats the tree against the signature this host process
recorded when it last saw the tree checked, and hashes nothing. Attacks: the agent (root
here) changes the tree between handles, in every way that keeps a file's size and mtime
or its bytes; a signature of another sandbox or directory is offered; a malformed one is
passed on the command line. Every change is caught: the tree is hashed again and, where
it differs, installed again.

The add-on and the runtime come from the checkout's dist/ (built on demand).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_tools.injector.addon_delivery import AddonInstall, CheckedTrees, ensure_browser
from sandbox_tools.injector.inject import ToolSupport, forget_sandbox, tool_support_sandbox
from sandbox_tools.sandboxes.base import Sandbox
from sandbox_tools.sandboxes.containers import RunningContainer
from sandbox_tools.sandboxes.docker import DockerSandbox

pytestmark = [pytest.mark.docker, pytest.mark.security, pytest.mark.timeout(900)]
PAGE = "data:text/html,<p>ok</p>"


@contextlib.contextmanager
def _debian(engine: Any, image: str) -> Iterator[RunningContainer]:
    with RunningContainer(engine, image, network_mode="none") as container:
        yield container


async def _later_handle(sandbox: Sandbox) -> tuple[ToolSupport, AddonInstall]:
    """A new sample's handle in the same sandbox: the old handles dropped, a new one
    made, and the browser asked for."""
    await forget_sandbox(sandbox)
    support = await tool_support_sandbox(sandbox)
    return support, await ensure_browser(support)


async def _runs(sandbox: Sandbox, install: AddonInstall) -> None:
    dom = await sandbox.exec([install.executable, "--dump-dom", PAGE])
    assert b"<p>ok</p>" in dom.stdout, dom.stderr[-500:]


async def test_a_later_handle_checks_the_tree_by_its_signature_not_by_hashing_it(
    docker_engine: Any, python_image: str
) -> None:
    with _debian(docker_engine, python_image) as container:
        sandbox = container.sandbox
        first = await ensure_browser(await tool_support_sandbox(sandbox))
        assert not first.reused and first.transfer == "tar"
        _, later = await _later_handle(sandbox)
        assert later.reused and later.sent_bytes == 0
        assert later.check == "signature"
        await _runs(sandbox, later)
        # A new host process knows no signature: its first check hashes the tree once,
        # its next one does not.
        await forget_sandbox(sandbox)
        fresh = DockerSandbox(container.container, docker_engine)
        _, hashed = await _later_handle(fresh)
        assert hashed.reused and hashed.check == "hash"
        _, signed = await _later_handle(fresh)
        assert signed.reused and signed.check == "signature"
        await forget_sandbox(fresh)


# (what the agent does to the tree between two handles, what the next handle finds)
CHANGES = {
    # A byte changed in place, the file's size and mtime restored (`touch -r`): only
    # its ctime says so.
    "content, size and mtime kept": (
        'f="$1/fonts.conf"; touch -r "$f" /tmp/ref && printf X | '
        'dd of="$f" bs=1 seek=3 conv=notrunc 2>/dev/null && touch -r /tmp/ref "$f"',
        "installed",
    ),
    "file replaced by an equal copy": (
        'cp -p "$1/fonts.conf" /tmp/copy && mv /tmp/copy "$1/fonts.conf"',
        "hashed",
    ),
    "entry added": ('touch -r "$1/fonts.conf" "$1/lib/extra.so"', "installed"),
    "entry removed": ('rm "$1/fonts.conf"', "installed"),
    "mode changed": ('chmod 700 "$1/fonts.conf"', "installed"),
    "mode changed and back": ('chmod 700 "$1/fonts.conf" && chmod 644 "$1/fonts.conf"', "hashed"),
    "others may write": ('chmod o+w "$1/lib"', "installed"),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_change_between_handles_is_caught_and_the_tree_checked_again(
    docker_engine: Any, python_image: str, change: str
) -> None:
    """Rule 2: the signature stands for the tree only while nothing moved; a change the
    hash sees (other bytes, an entry more or less, another mode) has the tree installed
    again, one it does not (equal bytes in a new inode, a mode put back) has it hashed
    and reused; either way the next handle is back to the signature."""
    script, outcome = CHANGES[change]
    with _debian(docker_engine, python_image) as container:
        sandbox = container.sandbox
        installed = await ensure_browser(await tool_support_sandbox(sandbox))
        changed = await sandbox.exec(["sh", "-c", script, "change", installed.directory])
        assert changed.returncode == 0, changed.stderr
        _, after = await _later_handle(sandbox)
        if outcome == "installed":
            assert not after.reused and after.sent_bytes > 0, after
        else:
            assert after.reused and after.check == "hash", after
        await _runs(sandbox, after)
        _, next_one = await _later_handle(sandbox)
        assert next_one.reused and next_one.check == "signature"
        await forget_sandbox(sandbox)


async def test_a_signature_is_never_applied_to_another_sandbox_or_directory(
    docker_engine: Any, python_image: str
) -> None:
    """The runtime itself, offered the signature one sandbox's tree has: in a second
    sandbox holding the same add-on, and in a copy of the tree (`cp -a`: every mode and
    mtime kept) in the first, it hashes the tree. A malformed signature is one sentence
    and exit 1."""
    with _debian(docker_engine, python_image) as one, _debian(docker_engine, python_image) as two:
        support = await tool_support_sandbox(one.sandbox)
        installed = await ensure_browser(support)
        tree = installed.artifact.tree
        assert tree is not None
        signature = CheckedTrees.of(one.sandbox).signature(installed.directory, tree.digest)
        assert signature is not None and signature.startswith("stat:")
        assert CheckedTrees.of(two.sandbox).signature(installed.directory, tree.digest) is None

        async def check(sandbox: Sandbox, exe: str, directory: str, argument: str) -> Any:
            return await sandbox.exec([exe, "addon-check", directory, tree.digest, argument])

        done = await check(one.sandbox, support.exe, installed.directory, signature)
        assert b'"method": "signature"' in done.stdout and b'"state": "ok"' in done.stdout

        other = await tool_support_sandbox(two.sandbox)
        elsewhere = await ensure_browser(other)
        assert elsewhere.directory == installed.directory  # the same path, another tree
        done = await check(two.sandbox, other.exe, elsewhere.directory, signature)
        assert b'"method": "hash"' in done.stdout and b'"state": "ok"' in done.stdout, done

        copied = await one.sandbox.exec(["cp", "-a", installed.directory, "/opt/browser-copy"])
        assert copied.returncode == 0, copied.stderr
        done = await check(one.sandbox, support.exe, "/opt/browser-copy", signature)
        assert b'"method": "hash"' in done.stdout and b'"state": "ok"' in done.stdout, done

        for malformed in ("stat:xyz", "--help", tree.digest, "stat:" + "0" * 64 + "\n"):
            done = await check(one.sandbox, support.exe, installed.directory, malformed)
            assert done.returncode == 1 and done.stdout == b"", done
            said = done.stderr.decode()
            assert said.startswith("sandbox-tools: ") and "is not a stat signature" in said
            assert "Traceback" not in said and said.count("\n") == 1, said
        await forget_sandbox(one.sandbox)
        await forget_sandbox(two.sandbox)
