"""An add-on's tree from Debian packages, assembled in the builder container.

Each add-on (the browser, the desktop) has an `assemble.py` in its resources that says
which programs its tree holds and where (its `Recipe`); this module does the rest the
same way for each, with the builder's python3 and the standard library only (plus our
ELF reader and packer, copied in beside it):

- `lock` (network; only for `--update-lock`): download the recipe's packages and their
  package-level dependency closure, keep the packages whose files the tree really uses,
  write their exact versions, URLs and SHA-256s.
- `build` (no network): unpack exactly the locked packages with `dpkg-deb -x`, take the
  recipe's files, the glibc loader and the recursive DT_NEEDED closure of every ELF
  object (libraries in `lib/`), confine the loader and the objects to the tree, add a
  copyright file per package (`licenses/<package>/copyright`) and `<kind>.json`, and
  write the tree as one deterministic tar.xz.

The closure follows DT_NEEDED, not the packages' Depends: those pull in much the
programs never load.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from sandbox_tools.build_containers.elf import is_elf, read_elf
from sandbox_tools.build_containers.tree_archive import write_archive

TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
LOADERS = {"amd64": "ld-linux-x86-64.so.2", "arm64": "ld-linux-aarch64.so.1"}
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main\n"
    "deb http://deb.debian.org/debian bookworm-updates main\n"
    "deb http://deb.debian.org/debian-security bookworm-security main\n"
)
LICENCE_ONLY = "  # licence only"
# The loader reads the preload list the image owns, and no variable or switch turns that
# off: the bundled copy gets a path that cannot exist (/dev/null is no directory), of
# the same length, as the runtime's loader does (bundle_libs.py).
PRELOAD_LIST = b"/etc/ld.so.preload\0"
NO_PRELOAD_LIST = b"/dev/null/.preload\0"

Roots = dict[str, str]  # package -> its unpacked root
Tree = dict[str, str]  # tree path -> the file it is made from


@dataclass(frozen=True)
class Recipe:
    """What one add-on's tree is: its packages and where their files go."""

    kind: str  # the add-on's kind: names <kind>.json and the work directory
    entry: str  # the tree path of the entry point (a static launcher built beside)
    packages: tuple[str, ...]  # what the lock resolves, for the target's architecture
    # (roots, arch) -> the tree's files before the loader and the libraries, and the
    # packages they came from.
    plan: Callable[[Roots, str], tuple[Tree, set[str]]]
    # Directories (besides lib/<triplet> and usr/lib/<triplet>) that hold libraries.
    library_dirs: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)  # more fields of <kind>.json
    # What the lock resolves too, of Architecture: all (apt knows them by the bare name).
    common_packages: tuple[str, ...] = ()


def unpack(debs: dict[str, str], into: str) -> Roots:
    """package -> its unpacked root, one directory per package."""
    roots = {}
    for package, deb in sorted(debs.items()):
        root = os.path.join(into, package)
        os.makedirs(root, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        roots[package] = root
    return roots


def resolve(root: str, path: str) -> str | None:
    """A path inside a package root with its symlinks followed inside that root."""
    for _ in range(40):
        full = os.path.join(root, path)
        if not os.path.islink(full):
            return full if os.path.exists(full) else None
        target = os.readlink(full)
        base = "" if target.startswith("/") else posixpath.dirname(path)
        path = posixpath.normpath(posixpath.join(base, target.lstrip("/")))
    return None


def needed(root: str, path: str) -> str:
    """A file a recipe needs from a package, or the build stops naming it."""
    found = resolve(root, path)
    if found is None or not os.path.isfile(found):
        raise SystemExit(f"assemble: {posixpath.basename(root)} has no {path}")
    return found


def library_index(roots: Roots, arch: str, extra: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """soname -> (package, real file) over every package's library directories.

    Top-level directories first, then their subdirectories: a library found through an
    absolute run path (libpulse's pulseaudio/) still resolves, a plugin's private copy
    never shadows the real one. In the tree every library sits in lib/.
    """
    triplet = TRIPLETS[arch]
    index: dict[str, tuple[str, str]] = {}
    candidates: dict[str, list[tuple[int, str, str]]] = {}
    for depth in (0, 1):
        for package, root in sorted(roots.items()):
            for top in (f"lib/{triplet}", f"usr/lib/{triplet}", *extra):
                if not os.path.isdir(os.path.join(root, top)):
                    continue
                directories = (
                    [top]
                    if depth == 0
                    else [
                        posixpath.join(top, d)
                        for d in sorted(os.listdir(os.path.join(root, top)))
                        if os.path.isdir(os.path.join(root, top, d))
                        and not os.path.islink(os.path.join(root, top, d))
                    ]
                )
                for directory in directories:
                    for name in sorted(os.listdir(os.path.join(root, directory))):
                        if ".so" not in name:
                            continue
                        real = resolve(root, posixpath.join(directory, name))
                        if real is not None and os.path.isfile(real):
                            candidates.setdefault(name, []).append((depth, package, real))
    # Two packages may ship one soname (libelogind0 and libsystemd0 both libsystemd.so.0):
    # the one named after the library wins, as Debian's shlibs would pick it.
    for name, found in candidates.items():
        stem = name.split(".so")[0]
        _, package, real = min(found, key=lambda c: (c[0], stem not in c[1], c[1]))
        index[name] = (package, real)
    return index


def _needed_of(path: str) -> list[str]:
    with open(path, "rb") as handle:
        data = handle.read()
    return read_elf(data).needed if is_elf(data) else []


def plan_tree(recipe: Recipe, roots: Roots, arch: str) -> tuple[Tree, set[str], list[str]]:
    """(tree path -> source file, packages used, sonames nobody provides): the recipe's
    files, the loader at the tree's top, every library they need in lib/."""
    tree, used = recipe.plan(roots, arch)
    triplet, loader = TRIPLETS[arch], LOADERS[arch]
    places = (f"lib/{triplet}/{loader}", f"usr/lib/{triplet}/{loader}", f"lib/{loader}")
    found = [f for f in (resolve(roots["libc6"], p) for p in places) if f is not None]
    if not found:
        raise SystemExit(f"assemble: libc6 has none of {', '.join(places)}")
    tree[loader] = found[0]
    used.add("libc6")
    index = library_index(roots, arch, recipe.library_dirs)
    present = {posixpath.basename(p) for p in tree}
    queue = sorted(tree)
    missing: list[str] = []
    while queue:
        for soname in _needed_of(tree[queue.pop()]):
            if soname in present:
                continue
            if soname not in index:
                if soname not in missing:
                    missing.append(soname)
                continue
            package, source = index[soname]
            tree[f"lib/{soname}"] = source
            present.add(soname)
            used.add(package)
            queue.append(f"lib/{soname}")
    return tree, used, missing


def confine_to_the_tree(tree: Tree, arch: str, work: str) -> None:
    """Make the bundled loader find the tree's libraries in the tree alone.

    Programs open optional libraries the tree does not carry: a loader looking in the
    image's preload list, library cache and system directories would load the image's
    code into a checked program. So the loader gets a preload list that cannot exist,
    the launcher passes --inhibit-cache, and every dynamic object of the tree is marked
    DF_1_NODEFLIB (`patchelf --no-default-lib`): what it needs or opens by name is then
    searched in the launcher's --library-path only, never in the default directories.
    The tree's entries are copied first: the unpacked packages stay as they were."""
    loader = LOADERS[arch]
    for path in sorted(tree):
        source = tree[path]
        with open(source, "rb") as handle:
            data = handle.read()
        if path == loader:
            if data.count(PRELOAD_LIST) != 1:
                raise SystemExit(f"assemble: {loader} names {PRELOAD_LIST!r} not once")
            data = data.replace(PRELOAD_LIST, NO_PRELOAD_LIST)
        elif not (is_elf(data) and read_elf(data).dynamic):
            continue
        copy = os.path.join(work, "confined", path)
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        with open(copy, "wb") as handle:
            handle.write(data)
        shutil.copymode(source, copy)
        if path != loader:
            subprocess.run(["patchelf", "--no-default-lib", copy], check=True)
        tree[path] = copy


def copyright_of(roots: Roots, package: str) -> tuple[str | None, str | None]:
    """(copyright file, or the package whose doc directory this one's points to)."""
    doc = os.path.join(roots[package], "usr/share/doc", package)
    if os.path.islink(doc):
        return None, posixpath.basename(os.readlink(doc).rstrip("/"))
    path = os.path.join(doc, "copyright")
    return (path, None) if os.path.isfile(path) else (None, None)


def build(recipe: Recipe, arch: str, debs_dir: str, built: list[str], out: str) -> None:
    """The add-on's tar.xz in `out`; `built` are `tree-path=file` pairs made beside (the
    launcher), taken as they are."""
    with open(os.path.join(debs_dir, "lock.json")) as handle:
        locked = json.load(handle)
    debs = {p["name"]: os.path.join(debs_dir, p["file"]) for p in locked["packages"]}
    work = f"/tmp/{recipe.kind}"
    shutil.rmtree(work, ignore_errors=True)
    roots = unpack(debs, f"{work}/packages")
    tree, used, missing = plan_tree(recipe, roots, arch)
    if missing:
        raise SystemExit(f"assemble: no locked package provides {', '.join(missing)}")
    unused = sorted(set(debs) - used - set(locked.get("licence_only", [])))
    if unused:
        raise SystemExit(f"assemble: locked but unused: {', '.join(unused)}")
    confine_to_the_tree(tree, arch, work)
    for pair in built:
        path, _, source = pair.partition("=")
        tree[path] = source
    if recipe.entry not in tree:
        raise SystemExit(f"assemble: the entry point {recipe.entry} was not built")
    licences: dict[str, str] = {}
    for package in sorted(debs):
        found, other = copyright_of(roots, package)
        if found is None and other in roots:
            found, _ = copyright_of(roots, other)
        if found is None:
            raise SystemExit(f"assemble: no copyright file for {package}")
        licences[f"licenses/{package}/copyright"] = found
    metadata = {
        "build_id": locked["build_id"],
        "platform": f"linux/{arch}",
        "kind": recipe.kind,
        "entry": recipe.entry,
        "packages": {p["name"]: p["version"] for p in locked["packages"]},
        **recipe.metadata,
    }
    documents = {
        f"{recipe.kind}.json": (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    }
    write_archive({**tree, **licences}, documents, os.path.join(out, locked["name"]))
    size = sum(os.path.getsize(p) for p in {**tree, **licences}.values())
    print(f"tree: {len(tree) + len(licences) + len(documents)} files, {size} bytes")


# -- lock (network) ----------------------------------------------------------------------


def _apt(*args: str) -> str:
    return subprocess.run(["apt-get", *args], check=True, capture_output=True, text=True).stdout


def _closure(arch: str, wanted: list[str]) -> list[str]:
    """Every package name of `wanted`'s dependency closure, for the target's architecture."""
    depends = subprocess.run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            *wanted,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = {line.strip() for line in depends.splitlines() if line and not line.startswith(" ")}
    # Every name for the target architecture (apt would take unqualified ones as native).
    return sorted({f"{n.split(':')[0]}:{arch}" for n in names - {""} if not n.startswith("<")})


def _uris(arch: str, names: list[str]) -> dict[str, dict[str, str]]:
    """package -> its URL, file, size and SHA-256 on the mirror. Per name: a foreign
    closure lists alternatives that do not exist for that architecture (libdrm-intel1 on
    arm64); those are skipped, not fatal."""
    uris: dict[str, dict[str, str]] = {}
    for qualified in names:
        for name in (qualified, qualified.split(":")[0]):  # Architecture: all answers bare
            found = subprocess.run(
                ["apt-get", "download", "--print-uris", name], capture_output=True, text=True
            )
            if found.returncode != 0 or not found.stdout.strip():
                continue
            url, file, size, digest = found.stdout.split()
            if file.endswith((f"_{arch}.deb", "_all.deb")):
                uris[file.split("_")[0]] = {
                    "url": url.strip("'"),
                    "file": file,
                    "size": size,
                    "sha256": digest.split(":", 1)[1],
                }
                break
    return uris


def lock(recipe: Recipe, arch: str, out: str) -> None:
    """`<kind>-<arch>.lock` in `out`: the packages the tree uses, pinned."""
    with open("/etc/apt/sources.list", "w") as handle:
        handle.write(SOURCES)
    subprocess.run(["dpkg", "--add-architecture", arch], check=True)
    _apt("update", "-qq")
    names = _closure(arch, [f"{p}:{arch}" for p in recipe.packages] + [*recipe.common_packages])
    uris = _uris(arch, names)
    work = "/tmp/lock"
    os.makedirs(f"{work}/debs", exist_ok=True)
    debs = {}
    for name, uri in sorted(uris.items()):
        debs[name] = os.path.join(work, "debs", uri["file"])
        urllib.request.urlretrieve(uri["url"], debs[name])
    roots = unpack(debs, f"{work}/packages")
    _, used, missing = plan_tree(recipe, roots, arch)
    if missing:
        raise SystemExit(f"lock: nothing in the dependency closure provides {missing}")
    licence_only = set()
    for package in sorted(used):
        path, other = copyright_of(roots, package)
        if path is None and other in roots:
            licence_only.add(other)
    lines = []
    for name in sorted(used | licence_only):
        version, architecture = (
            subprocess.run(
                ["dpkg-deb", "-f", debs[name], name_of_field],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            for name_of_field in ("Version", "Architecture")
        )
        lines.append(
            f"{name}:{architecture}={version} {uris[name]['sha256']} {uris[name]['size']} "
            f"{uris[name]['url']}" + (LICENCE_ONLY if name in licence_only else "")
        )
    with open(os.path.join(out, f"{recipe.kind}-{arch}.lock"), "w") as handle:
        handle.write("".join(f"{line}\n" for line in lines))
    print(f"locked {len(lines)} packages of {len(names)} in the dependency closure")


def main(recipe: Recipe, argv: list[str]) -> None:
    """`lock ARCH OUT` or `build ARCH DEBS OUT [PATH=FILE ...]`."""
    command, *rest = argv
    if command == "lock":
        lock(recipe, *rest)
    elif command == "build":
        arch, debs_dir, out, *built = rest
        build(recipe, arch, debs_dir, built, out)
    else:
        raise SystemExit(f"unknown command {command}")
