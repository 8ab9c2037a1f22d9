"""`tools validate --static` on a browser add-on, on real files and without an engine.

The tree is made of this machine's own ELF files (its loader, libc, NSS and their
DT_NEEDED closure, /bin/true standing in for the browser), DejaVu fonts and our launcher
compiled with musl-gcc, packed by the real packer; each defect is made for real (a
library left out, no fonts.conf, a licence missing, another build's metadata).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind, sha256_of
from sandbox_tools.build_containers import tree_archive
from sandbox_tools.build_containers.addon_recipes import ADDONS
from sandbox_tools.build_containers.elf import is_elf, read_elf
from sandbox_tools.build_containers.tree_archive import write_archive
from sandbox_tools.distro_matrix.static import NSS_CHECKSUMS, NSS_MODULES, static_checks
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.addons import TreeDigest, digest_of_archive

BROWSER_RESOURCES = ADDONS[ArtifactKind.BROWSER].resources
HOST_LIBS = (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"))
HOST_LOADER = Path("/lib64/ld-linux-x86-64.so.2")
FONTS = Path("/usr/share/fonts/truetype/dejavu")
BUILD_ID = "sha256:" + "cd" * 32
PACKAGES = {"chromium-headless-shell": "1", "libc6": "2"}
pytestmark = pytest.mark.skipif(
    os.uname().machine != "x86_64"
    or shutil.which("musl-gcc") is None
    or not HOST_LOADER.exists()
    or not (HOST_LIBS[1] / "libsoftokn3.so").exists()
    or not (FONTS / "DejaVuSans.ttf").exists(),
    reason="needs an x86_64 glibc host with musl-tools, NSS and DejaVu fonts",
)


@pytest.fixture(autouse=True)
def _fast_compression(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks read the tree, not how hard it was compressed: xz's fastest preset takes
    these tests from about 100 s to a few (the real preset is the packer test's)."""
    monkeypatch.setattr(tree_archive, "XZ_PRESET", 0)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("launcher") / "chrome"
    source = BROWSER_RESOURCES / "launcher.c"
    subprocess.run(["musl-gcc", "-static", "-Os", "-o", str(out), str(source)], check=True)
    return out


def _host_library(name: str) -> Path:
    for directory in HOST_LIBS:
        if (directory / name).exists():
            return (directory / name).resolve()
    raise AssertionError(f"this host has no {name}")


def tree(launcher: Path, tmp: Path) -> dict[str, str]:
    """tree path -> host file: the launcher, a browser, its loader and the closure."""
    notes = tmp / "notes"
    notes.mkdir(exist_ok=True)
    (notes / "copyright").write_text("Copyright: somebody\n")
    (notes / "icudtl.dat").write_bytes(b"icu")
    files = {
        "chrome": str(launcher),
        "chromium-headless-shell": "/bin/true",
        "ld-linux-x86-64.so.2": str(HOST_LOADER.resolve()),
        "icudtl.dat": str(notes / "icudtl.dat"),
        "fonts.conf": str(BROWSER_RESOURCES / "fonts.conf"),
        "fonts/DejaVuSans.ttf": str(FONTS / "DejaVuSans.ttf"),
        **{f"licenses/{p}/copyright": str(notes / "copyright") for p in PACKAGES},
    }
    for name in (*NSS_MODULES, *NSS_CHECKSUMS):
        files[f"lib/{name}"] = str(_host_library(name))
    queue = [p for p in files if p != "chrome"]
    while queue:
        data = Path(files[queue.pop()]).read_bytes()
        for needed in read_elf(data).needed if is_elf(data) else []:
            if needed not in {Path(p).name for p in files}:
                files[f"lib/{needed}"] = str(_host_library(needed))
                queue.append(f"lib/{needed}")
    return files


def check(files: dict[str, str], tmp: Path, metadata: dict[str, object] | None = None) -> list[str]:
    document = {
        "build_id": BUILD_ID,
        "platform": "linux/amd64",
        "kind": "browser",
        "packages": PACKAGES,
        **(metadata or {}),
    }
    output = tmp / "sandbox-tools-browser-0.1.0-linux-amd64.tar.xz"
    write_archive(files, {"browser.json": json.dumps(document).encode()}, str(output))
    record = Artifact(
        name=output.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
        size=output.stat().st_size,
        sha256=sha256_of(output),
        build_id=BUILD_ID,
        tree=_tree(output),  # what tools build records
    )
    return static_checks(output, record)


def _tree(archive: Path) -> TreeDigest:
    with archive.open("rb") as handle:
        return digest_of_archive(handle)


def test_a_sound_tree_passes(launcher: Path, tmp_path: Path) -> None:
    assert check(tree(launcher, tmp_path), tmp_path) == []


def test_a_library_the_tree_lacks_is_named_with_what_needs_it(
    launcher: Path, tmp_path: Path
) -> None:
    files = tree(launcher, tmp_path)
    del files["lib/libnspr4.so"]
    problems = check(files, tmp_path)
    assert "lib/libsoftokn3.so needs libnspr4.so, which the tree lacks" in problems
    assert all("libnspr4.so" in p for p in problems), problems


def test_a_module_nss_opens_itself_is_required_though_nothing_links_it(
    launcher: Path, tmp_path: Path
) -> None:
    files = tree(launcher, tmp_path)
    del files["lib/libsoftokn3.so"]
    assert check(files, tmp_path) == ["no lib/libsoftokn3.so (NSS opens it with dlopen)"]


def test_fonts_their_configuration_and_licences(launcher: Path, tmp_path: Path) -> None:
    files = tree(launcher, tmp_path)
    del files["fonts/DejaVuSans.ttf"], files["licenses/libc6/copyright"]
    assert check(files, tmp_path) == [
        "fonts.conf names fonts/, which holds no fonts",
        "no licence for libc6 (licenses/libc6/copyright)",
    ]
    del files["fonts.conf"]
    assert "no fonts.conf (without one Chromium aborts, even for --dump-dom)" in check(
        files, tmp_path
    )


def test_a_dynamic_launcher_and_another_builds_metadata(launcher: Path, tmp_path: Path) -> None:
    files = tree(launcher, tmp_path)
    files["chrome"] = "/bin/true"
    problems = check(files, tmp_path, {"build_id": "sha256:" + "00" * 32})
    assert problems == [
        f"browser.json says build_id {'sha256:' + '00' * 32!r}, the record {BUILD_ID!r}",
        "chrome is not statically linked",
    ]


def test_a_record_of_other_bytes_and_an_unreadable_archive(launcher: Path, tmp_path: Path) -> None:
    files = tree(launcher, tmp_path)
    assert check(files, tmp_path) == []
    output = tmp_path / "sandbox-tools-browser-0.1.0-linux-amd64.tar.xz"
    record = Artifact(
        name=output.name,
        arch=Arch.AMD64,
        format=ArtifactFormat.TAR_XZ,
        kind=ArtifactKind.BROWSER,
        size=output.stat().st_size,
        sha256=sha256_of(output),
        build_id=BUILD_ID,
        tree=_tree(output),
    )
    output.write_bytes(output.read_bytes()[:4096])
    problems = static_checks(output, record)
    assert problems[0] == f"size 4096 differs from the record's {record.size}"
    assert problems[1].startswith("archive: cannot be read back")
    assert static_checks(output, replace(record, size=4096))[0].startswith("archive:")
