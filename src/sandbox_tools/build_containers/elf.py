"""What the static checks need to know of an ELF file, read without running it.

Only 64-bit little-endian files (amd64 and arm64): the machine, the program headers, and
from the dynamic section the libraries it needs (DT_NEEDED), its run path, and the symbol
versions it needs (DT_VERNEED) or defines (DT_VERDEF). Addresses in the dynamic section
are virtual; PT_LOAD segments map them back to file offsets. Malformed input raises
ElfError, never an IndexError or struct.error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 15, 29
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = (
    0x6FFFFFFC,
    0x6FFFFFFD,
    0x6FFFFFFE,
    0x6FFFFFFF,
)
MACHINES = {62: "x86-64", 183: "aarch64"}


class ElfError(ValueError):
    """Not an ELF file this reader understands, or a damaged one."""


@dataclass
class ElfInfo:
    machine: int
    interpreter: bool = False
    dynamic: bool = False
    needed: list[str] = field(default_factory=list)
    run_path: list[str] = field(default_factory=list)
    needs_versions: set[str] = field(default_factory=set)  # e.g. {"GLIBC_2.34"}
    defines_versions: set[str] = field(default_factory=set)


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def read_elf(data: bytes) -> ElfInfo:
    try:
        return _read(data)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ElfError(f"damaged ELF file ({exc})") from None


def _read(data: bytes) -> ElfInfo:
    if not is_elf(data) or data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 18)
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    info = ElfInfo(machine)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    for index in range(phnum):
        base = phoff + index * phentsize
        p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, base)
        if p_type == PT_INTERP:
            info.interpreter = True
        elif p_type == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == PT_DYNAMIC:
            info.dynamic = True
            dynamic = (offset, filesz)
    if dynamic is None:
        return info

    def file_offset(address: int) -> int:
        for vaddr, offset, filesz in loads:
            if vaddr <= address < vaddr + filesz:
                return offset + address - vaddr
        raise ElfError(f"address {address:#x} is in no loaded segment")

    entries: dict[int, list[int]] = {}
    offset, size = dynamic
    for position in range(offset, offset + size, 16):
        tag, value = struct.unpack_from("<qQ", data, position)
        if tag == DT_NULL:
            break
        entries.setdefault(tag, []).append(value)
    if DT_STRTAB not in entries:
        return info
    strtab = file_offset(entries[DT_STRTAB][0])

    def string(at: int) -> str:
        end = data.index(b"\0", strtab + at)
        return data[strtab + at : end].decode()

    info.needed = [string(v) for v in entries.get(DT_NEEDED, [])]
    for tag in (DT_RUNPATH, DT_RPATH):
        for value in entries.get(tag, []):
            info.run_path += [p for p in string(value).split(":") if p]
    if DT_VERNEED in entries:
        position = file_offset(entries[DT_VERNEED][0])
        for _ in range(entries.get(DT_VERNEEDNUM, [0])[0]):
            _version, count, _file, aux, next_need = struct.unpack_from("<HHIII", data, position)
            aux_position = position + aux
            for _ in range(count):
                _hash, _flags, _other, name, next_aux = struct.unpack_from(
                    "<IHHII", data, aux_position
                )
                info.needs_versions.add(string(name))
                if not next_aux:
                    break
                aux_position += next_aux
            if not next_need:
                break
            position += next_need
    if DT_VERDEF in entries:
        position = file_offset(entries[DT_VERDEF][0])
        for _ in range(entries.get(DT_VERDEFNUM, [0])[0]):
            _version, _flags, _index, count, _hash, aux, next_def = struct.unpack_from(
                "<HHHHIII", data, position
            )
            if count:
                (name, _next) = struct.unpack_from("<II", data, position + aux)
                info.defines_versions.add(string(name))
            if not next_def:
                break
            position += next_def
    return info


def glibc_version(tag: str) -> tuple[int, ...] | None:
    """(2, 34) for "GLIBC_2.34"; None for other version names (GLIBC_PRIVATE, GCC_3.0)."""
    prefix, _, number = tag.partition("_")
    if prefix != "GLIBC" or not number.replace(".", "").isdigit():
        return None
    return tuple(int(part) for part in number.split("."))
