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

import posixpath
from pathlib import Path

from sandbox_tools.artifacts import Artifact, ArtifactFormat
from sandbox_tools.build_containers.elf import ElfError, glibc_version, is_elf, read_elf
from sandbox_tools.build_containers.package import (
    METADATA_ENTRY,
    PayloadError,
    read_metadata,
    read_payload,
)
from sandbox_tools.build_containers.records import tree_id
from sandbox_tools.platforms import Arch

MAX_ARTIFACT_BYTES = 15 * 1000 * 1000
ELF_MACHINES = {Arch.AMD64: 62, Arch.ARM64: 183}
LOADERS = {Arch.AMD64: "lib/ld-linux-x86-64.so.2", Arch.ARM64: "lib/ld-linux-aarch64.so.1"}
LIBRARY_PATH = ("lib", "_internal")  # the launcher's --library-path, relative to the tree


def static_checks(path: Path, record: Artifact) -> list[str]:
    """Every problem found in the artifact without running it; empty when it is sound."""
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
    for entry in files.values():
        if not is_elf(entry.content):
            continue
        try:
            info = read_elf(entry.content)
        except ElfError as exc:
            problems.append(f"payload: {entry.path}: {exc}")
            continue
        if info.machine != ELF_MACHINES[record.arch]:
            problems.append(f"payload: {entry.path} is built for ELF machine {info.machine}")
        here = posixpath.dirname(entry.path)
        search = [*LIBRARY_PATH, here]
        search += [
            posixpath.normpath(posixpath.join(here, p.replace("$ORIGIN", ".")))
            for p in info.run_path
            if p.startswith("$ORIGIN")
        ]
        for library in info.needed:
            if not any(posixpath.join(d, library) in present for d in search):
                problems.append(f"payload: {entry.path} needs {library}, which the tree lacks")
        if newest is not None:
            for tag in sorted(info.needs_versions):
                version = glibc_version(tag)
                if version is not None and version > newest:
                    problems.append(
                        f"payload: {entry.path} needs {tag}, newer than the bundled glibc "
                        f"(GLIBC_{'.'.join(map(str, newest))})"
                    )
    return problems


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
    return [
        f"payload: {METADATA_ENTRY} says {key} {metadata.get(key)!r}, the record {value!r}"
        for key, value in expected.items()
        if metadata.get(key) != value
    ]


def _newest_glibc(libc: bytes) -> tuple[int, ...] | None:
    try:
        defined = read_elf(libc).defines_versions
    except ElfError:
        return None
    versions = [v for v in map(glibc_version, defined) if v is not None]
    return max(versions) if versions else None
