"""The runtime's lookup of a browser add-on the host mounted when it made the container
(runtime/paths.py: mount_points, mounted_addon), on real directories and a mountinfo
file. THREAT_MODEL.md, "Delivering the add-on": only a read-only mount point is used; a
directory or a link an image prepares at that path is not one. The real mount is used in
tests/integration/test_browser_delivery.py."""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_tools.runtime.paths import BROWSER, DESKTOP, mount_points, mounted_addon


def _tree(root: Path, name: str) -> Path:
    tree = root / name
    tree.mkdir(parents=True)
    (tree / "chrome").write_text("#!/bin/sh\n")
    (tree / "chrome").chmod(0o755)
    return tree


def test_mountinfo_is_read_with_its_escapes_and_every_mount_kept(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_bytes(
        b"22 1 0:21 / / rw,relatime - overlay overlay rw\n"
        b"30 22 0:40 / /.sandbox-tools-addons/browser-ab rw,nosuid - tmpfs tmpfs rw\n"
        b"31 22 8:1 /tree /.sandbox-tools-addons/browser-ab ro,relatime - ext4 /dev/sda1 rw\n"
        b"32 22 8:1 /x /with\\040space\\134slash ro - ext4 /dev/sda1 rw\n"
        # Characters the kernel leaves as they are: they separate nothing.
        b"33 22 8:1 /v /evil\x1cro\x0bx\ry rw - ext4 /dev/sda1 rw\n"
        b"short line\n"
    )
    points = mount_points(str(info))
    assert points["/.sandbox-tools-addons/browser-ab"] == [["rw", "nosuid"], ["ro", "relatime"]]
    assert points["/with space\\slash"] == [["ro"]]
    assert points["/evil\x1cro\x0bx\ry"] == [["rw"]]
    assert "/evil" not in points
    assert mount_points(str(tmp_path / "none")) == {}


def test_only_one_read_only_mount_point_is_a_mounted_browser(tmp_path: Path) -> None:
    root = tmp_path / "addons"
    tree = _tree(root, f"browser-{'ab' * 8}")
    ro = {str(tree): [["ro", "relatime"]]}
    assert mounted_addon(BROWSER, str(root), ro) == str(tree / "chrome")
    # A directory that is not a mount point (an image's), or a writable mount: never.
    assert mounted_addon(BROWSER, str(root), {}) is None
    assert mounted_addon(BROWSER, str(root), {str(tree): [["rw", "relatime"]]}) is None
    # An image's volume stacked on it, or mounted inside it (over one of its libraries).
    assert mounted_addon(BROWSER, str(root), {str(tree): [["ro"], ["rw"]]}) is None
    assert (
        mounted_addon(BROWSER, str(root), {str(tree): [["ro"]], str(tree / "lib"): [["rw"]]})
        is None
    )
    # Two of them: which one the host meant cannot be told.
    other = _tree(root, f"browser-{'cd' * 8}")
    assert mounted_addon(BROWSER, str(root), {**ro, str(other): [["ro"]]}) is None
    assert mounted_addon(BROWSER, str(tmp_path / "missing"), ro) is None


def test_only_names_the_host_gives_its_mounts_are_looked_at(tmp_path: Path) -> None:
    root = tmp_path / "addons"
    for name in ("browser-evil", f"browser-{'AB' * 8}", f"browser-{'ab' * 8}x", "chrome"):
        tree = _tree(root / name.replace("/", "_"), name)
        assert mounted_addon(BROWSER, str(tree.parent), {str(tree): [["ro"]]}) is None, name


def test_a_link_or_an_open_way_where_a_mount_would_be_is_not_used(tmp_path: Path) -> None:
    root = tmp_path / "addons"
    real = _tree(tmp_path, "elsewhere")
    root.mkdir()
    name = f"browser-{'ab' * 8}"
    (root / name).symlink_to(real)
    link = str(root / name)
    assert mounted_addon(BROWSER, str(root), {link: [["ro"]], str(real): [["ro"]]}) is None
    # Inside a read-only mount nobody can change a file, whoever owns it and whatever
    # its mode says; a directory on the way others may write is another matter.
    loose = _tree(tmp_path / "loose", name)
    (loose / "chrome").chmod(0o777)
    os.chown(loose / "chrome", 1000, 1000)
    assert mounted_addon(BROWSER, str(tmp_path / "loose"), {str(loose): [["ro"]]}) == str(
        loose / "chrome"
    )
    os.chmod(tmp_path / "loose", 0o777)
    assert mounted_addon(BROWSER, str(tmp_path / "loose"), {str(loose): [["ro"]]}) is None


def test_each_add_on_finds_its_own_mount_and_never_anothers(tmp_path: Path) -> None:
    """The browser's and the desktop's trees side by side: each entry is its kind's."""
    root = tmp_path / "addons"
    browser = _tree(root, f"browser-{'ab' * 8}")
    desktop = root / f"desktop-{'cd' * 8}"
    desktop.mkdir()
    (desktop / "desktop").write_text("#!/bin/sh\n")
    points = {str(browser): [["ro"]], str(desktop): [["ro"]]}
    assert mounted_addon(BROWSER, str(root), points) == str(browser / "chrome")
    assert mounted_addon(DESKTOP, str(root), points) == str(desktop / "desktop")
    # A desktop tree named as a browser's has no `chrome`: no browser.
    (desktop / "desktop").rename(desktop / "other")
    assert mounted_addon(DESKTOP, str(root), points) is None
