"""The browser add-on, built for real: its static checks, and a page rendered by it where
nothing helps it (busybox without libc, uid 1000, no network, a read-only root).

The add-on is built by the `tools build` code (`built_browser`, tests/conftest.py); a
second session reuses it from the cache by build id. Defects are made for real: the
built tree repacked without a library it needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sandbox_tools.artifacts import ArtifactKind
from sandbox_tools.distro_matrix.static import addon_static_checks, static_checks
from sandbox_tools.platforms import Arch
from tests.support import (
    arches_under_test,
    locked_down_busybox,
    recorded_as_built,
    repacked_without,
)

pytestmark = [pytest.mark.long, pytest.mark.docker, pytest.mark.timeout(1800)]
HOST_ARCH = Arch.parse(os.uname().machine)

PAGE = """<!doctype html>
<html><body><p id="out">written by HTML</p>
<script>
  document.getElementById("out").textContent = ["rendered", "by", "JavaScript", 6 * 7].join(" ");
</script></body></html>
"""


@pytest.mark.parametrize("arch", arches_under_test(), ids=lambda a: a.value)
def test_the_built_add_on_passes_its_static_checks(built_browser: Any, arch: Arch) -> None:
    record, path = built_browser(arch)
    assert record.kind is ArtifactKind.BROWSER
    assert record.name.endswith(f"-linux-{arch.value}.tar.xz")
    assert static_checks(path, record) == []


def test_a_tree_without_a_library_fails_naming_who_needs_it(
    built_browser: Any, tmp_path: Path
) -> None:
    record, path = built_browser(HOST_ARCH)
    broken = repacked_without(path, tmp_path / record.name, "lib/libnss3.so")
    broken_record = recorded_as_built(record, broken)
    problems = addon_static_checks(broken, broken_record)
    assert "chromium-headless-shell needs libnss3.so, which the tree lacks" in problems
    # The only other finding: the fast repack (xz preset 0) is over the size budget.
    others = [p for p in problems if "libnss3.so" not in p]
    assert others == [f"{broken_record.size} bytes exceeds the 110000000 byte budget"]


async def test_the_add_on_renders_a_page_in_busybox_without_libc(
    docker_engine: Any, built_browser: Any
) -> None:
    """Streamed into a container that has only a static busybox and unpacked there (its
    xz reads the concatenated streams); Chromium runs as uid 1000 with no network, a
    read-only root and an exec tmpfs, and prints the DOM after the page's script ran.
    The host's architecture: arm64's add-on renders, submits and screenshots in busybox
    as uid 1000 in validate's browser cells (tests/release/test_rehearsal.py)."""
    arch = HOST_ARCH
    _, path = built_browser(arch)
    with locked_down_busybox(docker_engine, arch) as container:
        sandbox = container.sandbox
        unpacked = await sandbox.exec(
            ["sh", "-c", "mkdir /tmp/browser && xz -d | tar -x -C /tmp/browser"],
            input=path.read_bytes(),
            timeout=300,
        )
        assert unpacked.returncode == 0, unpacked.stderr.decode(errors="replace")
        # Through the exec's stdin: the engine's archive API cannot write to a tmpfs.
        await sandbox.exec(["sh", "-c", "cat > /tmp/page.html"], input=PAGE)
        rendered = await sandbox.exec(
            ["/tmp/browser/chrome", "--dump-dom", "file:///tmp/page.html"], timeout=600
        )
    assert rendered.returncode == 0, rendered.stderr.decode(errors="replace")[-3000:]
    dom = rendered.stdout.decode()
    assert '<p id="out">rendered by JavaScript 42</p>' in dom, dom
