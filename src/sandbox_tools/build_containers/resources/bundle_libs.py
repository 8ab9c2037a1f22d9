"""Copy the glibc closure of a PyInstaller onedir tree into its lib/ directory.

Runs inside the builder with the distribution's python3. Every ELF file of the tree
is resolved with `ldd`; whatever PyInstaller did not bundle (libc, libm, ..., and the
dynamic loader itself) goes to lib/. libc must never sit in _internal/: the bootloader
would prefer it over the loader's own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)")
LOADER = re.compile(r"^ld-linux-(x86-64\.so\.2|aarch64\.so\.1)$")
# The file every glibc loader reads its list of libraries to load into every program
# from, and no variable turns that off. The image owns it, and the runtime runs as root:
# the bundled loader gets a path that cannot exist instead (/dev/null is no directory),
# of the same length, its tail unchanged (another string may end inside it).
PRELOAD_LIST = b"/etc/ld.so.preload\0"
NO_PRELOAD_LIST = b"/dev/null/.preload\0"


def ignore_preload_list(loader: str) -> None:
    """Make the bundled loader blind to the image's /etc/ld.so.preload."""
    with open(loader, "rb") as handle:
        data = handle.read()
    if data.count(PRELOAD_LIST) != 1:
        sys.exit(f"bundle_libs: {loader} names {PRELOAD_LIST!r} {data.count(PRELOAD_LIST)} times")
    with open(loader, "wb") as handle:
        handle.write(data.replace(PRELOAD_LIST, NO_PRELOAD_LIST))


def is_elf(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


def closure(paths: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        output = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        for line in output.splitlines():
            match = LDD_LINE.match(line)
            if match:
                resolved = match.group(2)
                found.setdefault(os.path.basename(match.group(1) or resolved), resolved)
    return found


def main(tree: str) -> None:
    internal = os.path.join(tree, "_internal")
    elves = [os.path.join(tree, "runtime")]
    for directory, _, files in os.walk(internal):
        elves += [os.path.join(directory, f) for f in files if ".so" in f or f == "runtime"]
    elves = [path for path in elves if is_elf(path)]
    lib = os.path.join(tree, "lib")
    os.makedirs(lib, exist_ok=True)
    bundled = set(os.listdir(internal))
    for name in ("libc.so.6",):
        if name in bundled:
            os.replace(os.path.join(internal, name), os.path.join(lib, name))
            bundled.discard(name)
    for name, source in sorted(closure(elves).items()):
        if name in bundled:
            continue
        shutil.copyfile(os.path.realpath(source), os.path.join(lib, name))
        os.chmod(os.path.join(lib, name), 0o755)
    loaders = [name for name in os.listdir(lib) if LOADER.match(name)]
    if len(loaders) != 1 or "libc.so.6" not in os.listdir(lib):
        sys.exit(
            f"bundle_libs: expected one loader and libc in lib/, got {sorted(os.listdir(lib))}"
        )
    ignore_preload_list(os.path.join(lib, loaders[0]))
    print("bundled:", " ".join(sorted(os.listdir(lib))))


if __name__ == "__main__":
    main(sys.argv[1])
