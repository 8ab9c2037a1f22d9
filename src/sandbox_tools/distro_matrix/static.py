"""`tools validate --static`: what can be known of an artifact without running it.

The outer file: the record's size, the size budget, a static ELF for the right machine
(no interpreter, no dynamic section: it must start in an image with no libc). Then, for
the portable format, the payload read back as the launcher will unpack it
(`package.read_payload`): CRC-32s, the tree id the record's build id names, the bundled
loader and libc, every ELF of the tree built for the right machine, every library an
ELF needs present in the tree, and no symbol version newer than the bundled glibc
defines. Every problem is collected, not just the first.
"""

from __future__ import annotations

import json
import lzma
import posixpath
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from sandbox_tools.artifacts import Artifact, ArtifactFormat, ArtifactKind
from sandbox_tools.build_containers.elf import ElfError, glibc_version, is_elf, read_elf
from sandbox_tools.build_containers.package import (
    METADATA_ENTRY,
    PayloadError,
    read_metadata,
    read_payload,
)
from sandbox_tools.build_containers.records import tree_id
from sandbox_tools.build_containers.tree_archive import read_archive
from sandbox_tools.platforms import Arch
from sandbox_tools.runtime.addons import AddonError, algorithm_of, digest_of_archive

MAX_ARTIFACT_BYTES = 15 * 1000 * 1000
ELF_MACHINES = {Arch.AMD64: 62, Arch.ARM64: 183}
LOADERS = {Arch.AMD64: "lib/ld-linux-x86-64.so.2", Arch.ARM64: "lib/ld-linux-aarch64.so.1"}
LIBRARY_PATH = ("lib", "_internal")  # the launcher's --library-path, relative to the tree


def static_checks(path: Path, record: Artifact) -> list[str]:
    """Every problem found in the artifact without running it; empty when it is sound."""
    if record.kind in ADDON_SHAPES:
        return addon_static_checks(path, record)
    problems: list[str] = []
    data = path.read_bytes()
    if len(data) != record.size:
        problems.append(f"size {len(data)} differs from the record's {record.size}")
    if len(data) > MAX_ARTIFACT_BYTES:
        problems.append(f"{len(data)} bytes exceeds the {MAX_ARTIFACT_BYTES} byte budget")
    try:
        outer = read_elf(data)
    except ElfError:
        return [*problems, "not a 64-bit ELF executable"]
    if outer.machine != ELF_MACHINES[record.arch]:
        problems.append(
            f"ELF machine {outer.machine}, expected {ELF_MACHINES[record.arch]} for "
            f"{record.platform}"
        )
    if outer.interpreter:  # would need the container's dynamic loader
        problems.append("has an ELF interpreter: not statically linked")
    if outer.dynamic:  # would load the container's libraries
        problems.append("is dynamically linked")
    if record.format is ArtifactFormat.PORTABLE:
        problems += payload_problems(data, record)
    return problems


def payload_problems(data: bytes, record: Artifact) -> list[str]:
    try:
        trailer, entries = read_payload(data)
    except PayloadError as exc:
        return [f"payload: {exc}"]
    problems: list[str] = []
    if trailer.tree_id != tree_id(record.build_id):
        problems.append(
            f"payload: tree id {trailer.tree_id} is not the one build id {record.build_id} names"
        )
    problems += _metadata_problems(data, record)
    files = {e.path: e for e in entries if e.kind == "F"}
    links = {e.path: e.content.decode(errors="replace") for e in entries if e.kind == "L"}
    for needed in (LOADERS[record.arch], "lib/libc.so.6", "runtime"):
        if needed not in files:
            problems.append(f"payload: no {needed}")
    libc = files.get("lib/libc.so.6")
    newest = _newest_glibc(libc.content) if libc is not None else None
    present = set(files) | set(links)
    elves = {e.path: e.content for e in files.values() if is_elf(e.content)}
    problems += [
        f"payload: {found}"
        for found in tree_elf_problems(elves, present, LIBRARY_PATH, record.arch, newest)
    ]
    return problems


def tree_elf_problems(
    elves: Mapping[str, bytes],
    present: set[str],
    library_path: tuple[str, ...],
    arch: Arch,
    newest: tuple[int, ...] | None,
) -> list[str]:
    """Each ELF of a tree for the right machine, every DT_NEEDED present (by the library
    path, the file's own directory and its `$ORIGIN` run paths), no GLIBC_x.y newer than
    `newest` (the bundled glibc's)."""
    problems: list[str] = []
    for path, content in sorted(elves.items()):
        try:
            info = read_elf(content)
        except ElfError as exc:
            problems.append(f"{path}: {exc}")
            continue
        if info.machine != ELF_MACHINES[arch]:
            problems.append(f"{path} is built for ELF machine {info.machine}")
        here = posixpath.dirname(path)
        search = [*library_path, here]
        search += [
            posixpath.normpath(posixpath.join(here, p.replace("$ORIGIN", ".")))
            for p in info.run_path
            if p.startswith("$ORIGIN")
        ]
        for library in info.needed:
            if not any(posixpath.normpath(posixpath.join(d, library)) in present for d in search):
                problems.append(f"{path} needs {library}, which the tree lacks")
        if newest is not None:
            for tag in sorted(info.needs_versions):
                version = glibc_version(tag)
                if version is not None and version > newest:
                    problems.append(
                        f"{path} needs {tag}, newer than the bundled glibc "
                        f"(GLIBC_{'.'.join(map(str, newest))})"
                    )
    return problems


def _disagreements(where: str, metadata: Any, expected: Mapping[str, str]) -> list[str]:
    """What an artifact's own metadata says that its record does not."""
    if not isinstance(metadata, dict):
        return [f"{where} is not a JSON object"]
    return [
        f"{where} says {key} {metadata.get(key)!r}, the record {value!r}"
        for key, value in expected.items()
        if metadata.get(key) != value
    ]


def _metadata_problems(data: bytes, record: Artifact) -> list[str]:
    try:
        metadata = read_metadata(data)
    except PayloadError as exc:
        return [f"payload: {exc}"]
    if metadata is None:
        return [f"payload: no {METADATA_ENTRY} first in the archive"]
    expected = {
        "build_id": record.build_id,
        "platform": record.platform,
        "format": record.format.value,
    }
    return _disagreements(f"payload: {METADATA_ENTRY}", metadata, expected)


def _newest_glibc(libc: bytes) -> tuple[int, ...] | None:
    try:
        defined = read_elf(libc).defines_versions
    except ElfError:
        return None
    versions = [v for v in map(glibc_version, defined) if v is not None]
    return max(versions) if versions else None


# -- the add-ons ---------------------------------------------------------------------------

# Opened with dlopen, so no DT_NEEDED names them: NSS's modules (with the checksums the
# softoken verifies itself against) and the library the softoken keeps its database in.
NSS_MODULES = ("libsoftokn3.so", "libfreebl3.so", "libfreeblpriv3.so", "libnssckbi.so")
NSS_CHECKSUMS = ("libsoftokn3.chk", "libfreebl3.chk", "libfreeblpriv3.chk")


@dataclass(frozen=True)
class AddonShape:
    """What an add-on's tree must hold, beside a loader, libc and the closure of its ELF
    files (build_containers/resources/<kind>/assemble.py makes it)."""

    budget: int  # bytes of the tar.xz
    entry: str  # the static launcher
    library_path: tuple[str, ...]  # the launcher's --library-path (and more places searched)
    required: Mapping[str, str]  # tree path -> why it is needed ("" where plain)


ADDON_SHAPES = {
    ArtifactKind.BROWSER: AddonShape(
        budget=110 * 1000 * 1000,
        entry="chrome",
        library_path=("", "lib"),  # and the browser's own directory
        required={
            "chromium-headless-shell": "",
            "icudtl.dat": "",
            **{f"lib/{n}": "NSS opens it with dlopen" for n in (*NSS_MODULES, *NSS_CHECKSUMS)},
            "fonts.conf": "without one Chromium aborts, even for --dump-dom",
        },
    ),
    ArtifactKind.DESKTOP: AddonShape(
        budget=10 * 1000 * 1000,
        entry="desktop",
        library_path=("", "lib"),  # the loader, at the top, is every program's
        required={
            **{f"bin/{p}": "" for p in ("Xvfb", "xkbcomp", "xdotool", "twm", "xterm")},
            "lib/xkbcomp-shim.so": "Xvfb's keymap without a shell",
            "share/xkb/rules/evdev": "Xvfb's keymap",
            "share/locale/locale.dir": "without Xlib's locale tables text vanishes",
            "locale/C.utf8/LC_CTYPE": "typing beyond ASCII",
            "app-defaults/XTerm": "",
            "twmrc": "without one twm waits for a user to place each window",
            "fonts.conf": "",
        },
    ),
}


def _tree_problems(path: Path, record: Artifact) -> list[str]:
    """The record's tree digest is what the archive unpacks to: hosts install with the
    recorded one without hashing the archive, so a wrong one is caught here, once,
    before a release carries it (the runtime would refuse every install)."""
    if record.tree is None:
        return ["the record has no tree digest: build it again with this tools build"]
    try:
        with path.open("rb") as handle:
            found = digest_of_archive(handle, algorithm=algorithm_of(record.tree.digest))
    except (OSError, EOFError, tarfile.TarError, lzma.LZMAError, AddonError) as exc:
        return [f"archive: its tree cannot be digested ({exc})"]
    if found != record.tree:
        return [f"the record's tree {record.tree} is not the archive's {found}"]
    return []


def addon_static_checks(path: Path, record: Artifact) -> list[str]:
    """The add-on read back as the runtime will unpack it (tarfile + lzma), without
    running it: the members, the launcher, what its kind requires, the ELF closure,
    glibc versions, the fonts and their configuration, a licence per package, and the
    metadata."""
    shape = ADDON_SHAPES[record.kind]
    problems: list[str] = []
    size = path.stat().st_size
    if size != record.size:
        problems.append(f"size {size} differs from the record's {record.size}")
    if size > shape.budget:
        problems.append(f"{size} bytes exceeds the {shape.budget} byte budget")
    files: dict[str, bytes] = {}
    try:
        for member, content in read_archive(str(path)):
            name = member.name
            if name.startswith("/") or ".." in name.split("/"):
                problems.append(f"archive: {name} points outside the tree")
            elif member.isfile():
                files[name] = content
            elif not member.isdir():
                problems.append(f"archive: {name} is neither a file nor a directory")
    except (OSError, EOFError, tarfile.TarError, lzma.LZMAError) as exc:
        return [*problems, f"archive: cannot be read back ({exc})"]
    metadata = f"{record.kind.value}.json"
    problems += _addon_metadata_problems(metadata, files, record)
    problems += _tree_problems(path, record)
    loader = posixpath.basename(LOADERS[record.arch])
    problems += [
        f"no {name}" for name in (shape.entry, loader, "lib/libc.so.6") if name not in files
    ]
    problems += [
        f"no {name}" + (f" ({why})" if why else "")
        for name, why in shape.required.items()
        if name not in files
    ]
    if shape.entry in files:
        problems += _launcher_problems(shape.entry, files[shape.entry], record.arch)
    problems += _fonts_problems(files)
    problems += _licence_problems(metadata, files)
    libc = files.get("lib/libc.so.6")
    newest = _newest_glibc(libc) if libc is not None else None
    elves = {name: content for name, content in files.items() if is_elf(content)}
    elves.pop(shape.entry, None)  # static: checked above
    problems += tree_elf_problems(elves, set(files), shape.library_path, record.arch, newest)
    return problems


def _addon_metadata_problems(name: str, files: Mapping[str, bytes], record: Artifact) -> list[str]:
    try:
        metadata = json.loads(files[name])
    except KeyError:
        return [f"no {name}"]
    except ValueError as exc:
        return [f"{name} is not JSON ({exc})"]
    expected = {
        "build_id": record.build_id,
        "platform": record.platform,
        "kind": record.kind.value,
    }
    return _disagreements(name, metadata, expected)


def _launcher_problems(entry: str, content: bytes, arch: Arch) -> list[str]:
    try:
        info = read_elf(content)
    except ElfError as exc:
        return [f"{entry}: {exc}"]
    problems = []
    if info.machine != ELF_MACHINES[arch]:
        problems.append(f"{entry} is built for ELF machine {info.machine}")
    if info.interpreter or info.dynamic:
        problems.append(f"{entry} is not statically linked")
    return problems


def _fonts_problems(files: Mapping[str, bytes]) -> list[str]:
    """fonts.conf present and parseable, and every directory it names holds fonts."""
    if "fonts.conf" not in files:
        return []  # said by the required files
    try:
        config = ElementTree.fromstring(files["fonts.conf"])
    except ElementTree.ParseError as exc:
        return [f"fonts.conf is not XML ({exc})"]
    directories = [d.text or "" for d in config.iter("dir")]
    if not directories:
        return ["fonts.conf names no font directory"]
    problems = []
    for directory in directories:
        if directory.startswith("/"):
            problems.append(f"fonts.conf names {directory}, outside the tree")
        elif not any(
            name.startswith(directory.rstrip("/") + "/") and name.endswith((".ttf", ".otf"))
            for name in files
        ):
            problems.append(f"fonts.conf names {directory}/, which holds no fonts")
    return problems


def _licence_problems(metadata: str, files: Mapping[str, bytes]) -> list[str]:
    """A non-empty copyright file for every package the metadata lists."""
    try:
        packages = json.loads(files[metadata]).get("packages", {})
    except (KeyError, ValueError, AttributeError):
        return []  # said once, by the metadata check
    if not packages:
        return [f"{metadata} lists no packages: no licences can be checked"]
    return [
        f"no licence for {package} (licenses/{package}/copyright)"
        for package in sorted(packages)
        if not files.get(f"licenses/{package}/copyright")
    ]
