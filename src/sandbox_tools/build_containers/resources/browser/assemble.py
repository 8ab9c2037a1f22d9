"""The browser add-on's tree, assembled from Debian packages in the builder container.

Two commands, both run with the builder's python3 (standard library only, plus our own
ELF reader, `sandbox_tools.build_containers.elf`):

  lock ARCH OUT     (network; only for `browser --update-lock`) download chromium and
                    the package-level dependency closure, keep the packages whose files
                    the tree really uses, write their exact versions, URLs and SHA-256s
  build ARCH DEBS LAUNCHER OUT   (no network) unpack exactly the locked packages and
                    write the tree as one deterministic tar.xz

The tree is the recursive DT_NEEDED closure of chromium-headless-shell (not the package
set: its Depends pull in libllvm and mesa, which Chromium never loads), plus what
Chromium and NSS open with dlopen: the NSS modules and their .chk files, SwiftShader's
Vulkan, the ANGLE stubs. Layout (every path relative to the tree):

  chrome                    the static launcher: entry point and --browser-subprocess-path
  chromium-headless-shell   the browser; ICU data and .pak files beside it, because
  ld-linux-*.so.*           Chromium finds them relative to /proc/self/exe, which is this
                            loader when the launcher runs the browser through it
  lib/                      the libraries; NSS opens its modules from libnss3's directory
  fonts/, fonts.conf        DejaVu, and a configuration that names it (relative paths)
  licenses/<package>/       the copyright file of every package taken
  browser.json              build id, platform, the packages and their versions
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import sys
import urllib.request

# Our ELF reader, copied into the container with the package's skeleton (PYTHONPATH=/src).
from sandbox_tools.build_containers.elf import is_elf, read_elf
from sandbox_tools.build_containers.tree_archive import write_archive

TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
LOADERS = {"amd64": "ld-linux-x86-64.so.2", "arm64": "ld-linux-aarch64.so.1"}
ROOT_PACKAGES = ("chromium-headless-shell", "chromium-common")
EXTRA_PACKAGES = ("fonts-dejavu-core",)
CHROMIUM_DIR = "usr/lib/chromium"
FONTS_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fonts.conf")
# Never loaded by a headless browser that is told so: Vulkan's validation layer and mock
# driver (test tools, 23 MB), crashpad (it would upload crash reports), linker TOC files.
DROPPED = (
    "libVkLayer_khronos_validation.so",
    "libVkICD_mock_icd.so",
    "VkICD_mock_icd.json",
    "VkLayer_khronos_validation.json",
    "chrome_crashpad_handler",
)
NSS_MODULES = ("libsoftokn3.so", "libfreebl3.so", "libfreeblpriv3.so", "libnssckbi.so")
FONTS_DIR = "usr/share/fonts/truetype/dejavu"
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main\n"
    "deb http://deb.debian.org/debian bookworm-updates main\n"
    "deb http://deb.debian.org/debian-security bookworm-security main\n"
)


def unpack(debs: dict[str, str], into: str) -> dict[str, str]:
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


def library_index(roots: dict[str, str], arch: str) -> dict[str, tuple[str, str]]:
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
            for top in (f"lib/{triplet}", f"usr/lib/{triplet}", CHROMIUM_DIR):
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


def read_elf_file(path: str) -> list[str]:
    with open(path, "rb") as handle:
        data = handle.read()
    return read_elf(data).needed if is_elf(data) else []


def plan_tree(roots: dict[str, str], arch: str) -> tuple[dict[str, str], set[str], list[str]]:
    """(tree path -> source file, packages used, sonames nobody provides)."""
    triplet = TRIPLETS[arch]
    tree: dict[str, str] = {}
    used = set(ROOT_PACKAGES)
    for package in ROOT_PACKAGES:
        chromium = os.path.join(roots[package], CHROMIUM_DIR)
        for directory, _, files in os.walk(chromium):
            for name in files:
                if name in DROPPED or name.endswith(".TOC"):
                    continue
                source = os.path.join(directory, name)
                tree[os.path.relpath(source, chromium)] = source
    loader = LOADERS[arch]
    libc = roots["libc6"]
    places = (f"lib/{triplet}/{loader}", f"usr/lib/{triplet}/{loader}", f"lib/{loader}")
    found = [f for f in (resolve(libc, p) for p in places) if f is not None]
    if not found:
        raise SystemExit(f"assemble: libc6 has none of {', '.join(places)}")
    tree[loader] = found[0]
    used.add("libc6")
    nss = roots["libnss3"]
    for name in NSS_MODULES + tuple(m.replace(".so", ".chk") for m in NSS_MODULES):
        module = resolve(nss, f"usr/lib/{triplet}/{name}")
        if module is not None:
            tree[f"lib/{name}"] = module
        elif name != "libnssckbi.chk":  # the trust module has no checksum file
            raise SystemExit(f"assemble: libnss3 has no {name}")
    used.add("libnss3")
    for name in sorted(os.listdir(os.path.join(roots["fonts-dejavu-core"], FONTS_DIR))):
        if name.endswith(".ttf"):
            tree[f"fonts/{name}"] = os.path.join(roots["fonts-dejavu-core"], FONTS_DIR, name)
    used.add("fonts-dejavu-core")

    index = library_index(roots, arch)
    present = {posixpath.basename(p) for p in tree}
    queue = [p for p in sorted(tree) if not p.startswith("fonts/")]
    missing: list[str] = []
    while queue:
        for soname in read_elf_file(tree[queue.pop()]):
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


# The loader reads the preload list the image owns, and no variable or switch turns that
# off: the bundled copy gets a path that cannot exist (/dev/null is no directory), of
# the same length, as the runtime's loader does (bundle_libs.py).
PRELOAD_LIST = b"/etc/ld.so.preload\0"
NO_PRELOAD_LIST = b"/dev/null/.preload\0"


def confine_to_the_tree(tree: dict[str, str], arch: str, work: str) -> None:
    """Make the bundled loader find the browser's libraries in the tree alone.

    Chromium opens optional libraries the tree does not carry (libpci, libva, libgbm):
    a loader looking in the image's preload list, library cache and system directories
    would load the image's code into the checked browser. So the loader gets a preload
    list that cannot exist, the launcher passes --inhibit-cache, and every dynamic
    object of the tree is marked DF_1_NODEFLIB (`patchelf --no-default-lib`): what it
    needs or opens by name is then searched in the launcher's --library-path only, never
    in the default directories. The tree's entries are copied first: the unpacked
    packages stay as they were."""
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


def copyright_of(roots: dict[str, str], package: str) -> tuple[str | None, str | None]:
    """(copyright file, or the package whose doc directory this one's points to)."""
    doc = os.path.join(roots[package], "usr/share/doc", package)
    if os.path.islink(doc):
        return None, posixpath.basename(os.readlink(doc).rstrip("/"))
    path = os.path.join(doc, "copyright")
    return (path, None) if os.path.isfile(path) else (None, None)


def build(arch: str, debs_dir: str, launcher: str, out: str) -> None:
    with open(os.path.join(debs_dir, "lock.json")) as handle:
        locked = json.load(handle)
    debs = {p["name"]: os.path.join(debs_dir, p["file"]) for p in locked["packages"]}
    work = "/tmp/browser"
    shutil.rmtree(work, ignore_errors=True)
    roots = unpack(debs, f"{work}/packages")
    tree, used, missing = plan_tree(roots, arch)
    if missing:
        raise SystemExit(f"assemble: no locked package provides {', '.join(missing)}")
    unused = sorted(set(debs) - used - set(locked.get("licence_only", [])))
    if unused:
        raise SystemExit(f"assemble: locked but unused: {', '.join(unused)}")
    confine_to_the_tree(tree, arch, work)
    tree["chrome"] = launcher
    tree["fonts.conf"] = FONTS_CONF
    licences: dict[str, str] = {}
    for package in sorted(debs):
        path, other = copyright_of(roots, package)
        if path is None and other in roots:
            path, _ = copyright_of(roots, other)
        if path is None:
            raise SystemExit(f"assemble: no copyright file for {package}")
        licences[f"licenses/{package}/copyright"] = path
    documents = {
        "browser.json": (
            json.dumps(
                {
                    "build_id": locked["build_id"],
                    "platform": f"linux/{arch}",
                    "kind": "browser",
                    "entry": "chrome",
                    "packages": {p["name"]: p["version"] for p in locked["packages"]},
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        ).encode(),
    }
    write_archive({**tree, **licences}, documents, os.path.join(out, locked["name"]))
    size = sum(os.path.getsize(p) for p in {**tree, **licences}.values())
    print(f"tree: {len(tree) + len(licences) + len(documents)} files, {size} bytes")


# -- lock (network) ----------------------------------------------------------------------


def apt(*args: str) -> str:
    return subprocess.run(["apt-get", *args], check=True, capture_output=True, text=True).stdout


def lock(arch: str, out: str) -> None:
    with open("/etc/apt/sources.list", "w") as handle:
        handle.write(SOURCES)
    subprocess.run(["dpkg", "--add-architecture", arch], check=True)
    apt("update", "-qq")
    wanted = [f"{p}:{arch}" for p in ROOT_PACKAGES] + list(EXTRA_PACKAGES)
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
    names = sorted(
        {line.strip() for line in depends.splitlines() if line and not line.startswith(" ")} - {""}
    )
    # Every name for the target architecture (apt would take unqualified ones as native).
    names = sorted({f"{n.split(':')[0]}:{arch}" for n in names if not n.startswith("<")})
    # Per name: a foreign closure lists alternatives that do not exist for that
    # architecture (libdrm-intel1 on arm64); those are skipped, not fatal.
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
    work = "/tmp/lock"
    os.makedirs(f"{work}/debs", exist_ok=True)
    debs = {}
    for name, uri in sorted(uris.items()):
        debs[name] = os.path.join(work, "debs", uri["file"])
        urllib.request.urlretrieve(uri["url"], debs[name])
    roots = unpack(debs, f"{work}/packages")
    _, used, missing = plan_tree(roots, arch)
    if missing:
        raise SystemExit(f"lock: nothing in the dependency closure provides {missing}")
    licence_only = set()
    for package in sorted(used):
        path, other = copyright_of(roots, package)
        if path is None and other in roots:
            licence_only.add(other)
    packages = []
    for name in sorted(used | licence_only):
        version, architecture = (
            subprocess.run(
                ["dpkg-deb", "-f", debs[name], field],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            for field in ("Version", "Architecture")
        )
        packages.append(
            f"{name}:{architecture}={version} {uris[name]['sha256']} {uris[name]['size']} "
            f"{uris[name]['url']}" + ("  # licence only" if name in licence_only else "")
        )
    with open(os.path.join(out, f"browser-{arch}.lock"), "w") as handle:
        handle.write("".join(f"{line}\n" for line in packages))
    print(f"locked {len(packages)} packages of {len(names)} in the dependency closure")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "lock":
        lock(*rest)
    elif command == "build":
        build(*rest)
    else:
        raise SystemExit(f"unknown command {command}")
