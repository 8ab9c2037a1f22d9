"""The add-on tree's stat signature (runtime/addons.py): what lets a later `addon-check`
skip the hash, and everything that must make it hash again.

THREAT_MODEL.md, "Delivering the add-on": a tree is used only while it is the pinned
one. A signature taken when the tree was last checked stands for its content only as
long as no entry's lstat moved; every change below moves one (the ctime at least, which
no call sets), and then the tree is hashed in full. The real add-on in real containers:
tests/integration/test_addon_stat_signature.py.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.injector.addon_delivery import CheckedTrees
from sandbox_tools.runtime import addons
from sandbox_tools.runtime.addons import (
    COARSE_AGE_NS,
    FINE_AGE_NS,
    PLAIN,
    AddonError,
    EntryStat,
    check,
    digest_of_archive,
    install,
    settled_signature,
    signature_from,
    signature_of,
    stat_entries,
)
from sandbox_tools.sandboxes.local import LocalSandbox

OWNERS = frozenset({0, os.geteuid()})
FILES = {"chrome": b"#!/bin/sh\necho browser\n", "lib/libx.so": b"\x7fELF library"}


def _installed(tmp_path: Path) -> tuple[Path, str, str]:
    """A small add-on installed as `addon-install` does: (tree, pinned digest, the stat
    signature the install answered)."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        lib = tarfile.TarInfo("lib")
        lib.type, lib.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(lib)
        for name, data in FILES.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("lib/libx.so.1")
        link.type, link.linkname = tarfile.SYMTYPE, "libx.so"
        tar.addfile(link)
    data = plain.getvalue()
    tree = digest_of_archive(io.BytesIO(data), PLAIN)
    dest = tmp_path / "browser"
    answer = install(str(dest), tree.digest, tree.size, io.BytesIO(data), PLAIN)
    assert answer["state"] == "installed" and isinstance(answer["signature"], str), answer
    return dest, tree.digest, answer["signature"]


def _rewrite_keeping_size_and_mtime(tree: Path) -> None:
    """What `touch -d` after an edit does: other bytes, the same size, the old mtime."""
    chrome = tree / "chrome"
    before = chrome.stat()
    chrome.write_bytes(b"#!/bin/sh\necho planted\n"[: before.st_size].ljust(before.st_size))
    os.utime(chrome, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert chrome.stat().st_mtime_ns == before.st_mtime_ns


def _replace_by_a_copy(tree: Path) -> None:
    """The same bytes, mode and mtime in a new inode."""
    shutil.copy2(tree / "chrome", tree / "chrome.new")
    os.replace(tree / "chrome.new", tree / "chrome")


def _chmod_and_back(tree: Path) -> None:
    (tree / "chrome").chmod(0o700)
    (tree / "chrome").chmod(0o755)


def _relink(tree: Path) -> None:
    (tree / "lib/libx.so.1").unlink()
    (tree / "lib/libx.so.1").symlink_to("libx.so")


CHANGES: dict[str, tuple[Callable[[Path], Any], str]] = {
    # name: (the change, what the full check then says of the tree)
    "content, size and mtime kept": (_rewrite_keeping_size_and_mtime, "different"),
    "file replaced by an equal copy": (_replace_by_a_copy, "ok"),
    "entry added": (lambda t: (t / "lib/extra").write_bytes(b""), "different"),
    "entry removed": (lambda t: (t / "lib/libx.so").unlink(), "different"),
    "mode changed": (lambda t: (t / "chrome").chmod(0o700), "different"),
    "mode changed and back": (_chmod_and_back, "ok"),
    "group may write": (lambda t: (t / "lib").chmod(0o775), "different"),
    "link made again": (_relink, "ok"),
    "touched": (lambda t: os.utime(t / "lib/libx.so"), "ok"),
}


def test_an_unchanged_tree_is_ok_by_its_signature_and_the_walks_agree(tmp_path: Path) -> None:
    tree, digest, signature = _installed(tmp_path)
    assert signature_of(str(tree), stat_entries(str(tree), OWNERS)) == signature
    answer = check(str(tree), digest, signature)
    assert answer["state"] == "ok" and answer["method"] == "signature", answer
    assert answer["signature"] == signature
    # Without it, the tree is hashed, and the hash gives the same signature back.
    hashed = check(str(tree), digest)
    assert hashed["state"] == "ok" and hashed["method"] == "hash", hashed
    assert hashed["signature"] == signature


@pytest.mark.parametrize("change", list(CHANGES))
def test_every_change_moves_the_signature_and_the_tree_is_hashed_again(
    tmp_path: Path, change: str
) -> None:
    tree, digest, signature = _installed(tmp_path)
    tamper, verdict = CHANGES[change]
    tamper(tree)
    try:
        now: str | None = signature_of(str(tree), stat_entries(str(tree), OWNERS))
    except AddonError:  # a mode others may write: no signature at all
        now = None
    assert now != signature
    answer = check(str(tree), digest, signature)
    assert answer["method"] == "hash" and answer["state"] == verdict, answer
    if verdict == "ok":  # a new signature for the tree as it is now, used next time
        assert answer["signature"] not in (None, signature)
        again = check(str(tree), digest, str(answer["signature"]))
        assert again["method"] == "signature" and again["state"] == "ok"


def test_a_signature_of_another_directory_never_matches(tmp_path: Path) -> None:
    """A copy with every mtime kept, and the tree itself moved: neither is taken for the
    tree the signature was made of (the path, inodes and ctimes are in it)."""
    tree, digest, signature = _installed(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy, symlinks=True, copy_function=shutil.copy2)
    for other in (copy, tmp_path / "moved"):
        if other.name == "moved":
            tree.rename(other)
        answer = check(str(other), digest, signature)
        assert answer["state"] == "ok" and answer["method"] == "hash", answer
        assert answer["signature"] != signature


@pytest.mark.parametrize(
    "argument",
    ["", "stat:", "stat:" + "0" * 63, "stat:" + "G" * 64, "blake2b:" + "0" * 64, "x" * 5000],
)
def test_a_malformed_signature_is_one_sentence_and_exit_1(
    tmp_path: Path, argument: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, digest, _ = _installed(tmp_path)
    assert addons.main(["check", str(tree), digest, argument]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("sandbox-tools: ") and "is not a stat signature" in err, err
    assert "Traceback" not in err and len(err) < 300
    with pytest.raises(AddonError, match="stat:<64 hex>"):
        signature_from(argument)


def test_a_wellformed_signature_on_the_command_line_is_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree, digest, signature = _installed(tmp_path)
    assert addons.main(["check", str(tree), digest, signature]) == 0
    assert '"method": "signature"' in capsys.readouterr().out
    assert addons.main(["check", str(tree), digest, signature, "more"]) == 2


def test_ctimes_must_be_older_than_the_walk_by_more_than_their_granularity() -> None:
    fine = EntryStat("chrome", "f", 0o755, 0, 0, 1, 2, 3, 4, 1_700_000_000_123_456_789)
    coarse = replace(fine, ctime_ns=1_700_000_000_000_000_000)  # whole seconds
    assert addons._settled_at([fine]) == fine.ctime_ns + FINE_AGE_NS
    assert addons._settled_at([coarse]) == coarse.ctime_ns + COARSE_AGE_NS
    assert addons._settled_at([coarse, fine]) == coarse.ctime_ns + COARSE_AGE_NS


def test_a_tree_written_just_now_gets_its_signature_once_its_ctimes_settled(
    tmp_path: Path,
) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree/file").write_bytes(b"x")
    entries, signature = settled_signature(str(tmp_path / "tree"), OWNERS)
    assert signature is not None
    assert time.time_ns() >= addons._settled_at(entries)


def test_a_tree_too_fresh_for_a_signature_is_ok_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the ctimes do not settle in time (no patience here), the check answers ok
    without a signature: the host keeps none, and the next check hashes again."""
    tree, digest, _ = _installed(tmp_path)
    os.utime(tree / "chrome")  # a ctime of now
    monkeypatch.setattr(addons, "SIGNATURE_PATIENCE_NS", 0)
    answer = check(str(tree), digest)
    assert answer["state"] == "ok" and answer["signature"] is None, answer
    checked = CheckedTrees()
    checked.record(str(tree), digest, {"state": "ok", "signature": "stat:" + "a" * 64})
    checked.record(str(tree), digest, answer)
    assert checked.signature(str(tree), digest) is None


@pytest.mark.parametrize(
    "signature", [None, 1, ["stat:" + "a" * 64], "stat:" + "a" * 64 + "\n", "x", "stat:" + "A" * 64]
)
def test_a_signature_the_host_records_is_one_of_the_runtimes_form(signature: object) -> None:
    """Rule 3: whatever answers in the sandbox may send any JSON; only a signature of the
    runtime's form is kept (and only ever handed back to the runtime)."""
    checked = CheckedTrees()
    checked.record("/opt/st/browser", "blake2b:" + "0" * 64, {"signature": signature})
    assert checked.signature("/opt/st/browser", "blake2b:" + "0" * 64) is None


def test_the_hosts_records_are_per_sandbox_object_directory_and_digest() -> None:
    one, two = LocalSandbox(), LocalSandbox()
    good = "stat:" + "a" * 64
    CheckedTrees.of(one).record("/opt/st/browser", "blake2b:" + "0" * 64, {"signature": good})
    assert CheckedTrees.of(one).signature("/opt/st/browser", "blake2b:" + "0" * 64) == good
    assert CheckedTrees.of(two).signature("/opt/st/browser", "blake2b:" + "0" * 64) is None
    assert CheckedTrees.of(one).signature("/opt/other/browser", "blake2b:" + "0" * 64) is None
    assert CheckedTrees.of(one).signature("/opt/st/browser", "blake2b:" + "1" * 64) is None


async def test_the_server_checks_the_add_on_as_the_installers_command_does(tmp_path: Path) -> None:
    """`browser_info` with the add-on's directory and digest makes the same check on the
    channel (a later handle's check without an exec), by the signature where given."""
    from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
    from sandbox_tools.runtime.tools.web_browser.tool_types import InfoParams

    tree, digest, signature = _installed(tmp_path)
    controller = WebBrowserController()
    try:
        by_signature = await controller.info(
            InfoParams.parse(
                {
                    "version": False,
                    "addon_dir": str(tree),
                    "addon_digest": digest,
                    "addon_signature": signature,
                }
            )
        )
        assert by_signature["addon"]["state"] == "ok", by_signature
        assert by_signature["addon"]["method"] == "signature"
        (tree / "lib/extra").write_bytes(b"")
        after = await controller.info(
            InfoParams.parse(
                {
                    "version": False,
                    "addon_dir": str(tree),
                    "addon_digest": digest,
                    "addon_signature": signature,
                }
            )
        )
        assert after["addon"]["state"] == "different", after
        plain = await controller.info(InfoParams.parse({"version": False}))
        assert "addon" not in plain
    finally:
        await controller.shutdown()


@pytest.mark.parametrize(
    "params",
    [
        {"addon_dir": "/x"},  # no digest
        {"addon_digest": "blake2b:" + "0" * 64},  # no directory
        {"addon_dir": "relative", "addon_digest": "blake2b:" + "0" * 64},
        {"addon_dir": "/x", "addon_digest": "md5:00"},
        {"addon_dir": "/x", "addon_digest": "blake2b:" + "0" * 64, "addon_signature": "x"},
        {"addon_signature": "stat:" + "0" * 64},
    ],
)
async def test_a_malformed_add_on_check_is_refused_as_bad_params(params: dict[str, Any]) -> None:
    from sandbox_tools.runtime.jsonrpc import InvalidParams
    from sandbox_tools.runtime.tools.web_browser.controller import WebBrowserController
    from sandbox_tools.runtime.tools.web_browser.tool_types import InfoParams

    controller = WebBrowserController()
    try:
        with pytest.raises(InvalidParams):
            await controller.info(InfoParams.parse({"version": False, **params}))
    finally:
        await controller.shutdown()
