"""The browser add-on's tree: its recipe for `sandbox_tools.build_containers.debian_tree`.

Run with the builder's python3 (PYTHONPATH=/src, our ELF reader and packer copied in):

  lock ARCH OUT                          (network; `browser --update-lock`)
  build ARCH DEBS OUT chrome=LAUNCHER    (no network)

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

import os
import sys

from sandbox_tools.build_containers.debian_tree import (
    TRIPLETS,
    Recipe,
    Roots,
    Tree,
    main,
    needed,
)

ROOT_PACKAGES = ("chromium-headless-shell", "chromium-common")
CHROMIUM_DIR = "usr/lib/chromium"
HERE = os.path.dirname(os.path.abspath(__file__))
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


def plan(roots: Roots, arch: str) -> tuple[Tree, set[str]]:
    triplet = TRIPLETS[arch]
    tree: Tree = {"fonts.conf": os.path.join(HERE, "fonts.conf")}
    used = set(ROOT_PACKAGES)
    for package in ROOT_PACKAGES:
        chromium = os.path.join(roots[package], CHROMIUM_DIR)
        for directory, _, files in os.walk(chromium):
            for name in files:
                if name in DROPPED or name.endswith(".TOC"):
                    continue
                source = os.path.join(directory, name)
                tree[os.path.relpath(source, chromium)] = source
    nss = roots["libnss3"]
    for name in NSS_MODULES + tuple(m.replace(".so", ".chk") for m in NSS_MODULES):
        if name != "libnssckbi.chk":  # the trust module has no checksum file
            tree[f"lib/{name}"] = needed(nss, f"usr/lib/{triplet}/{name}")
    used.add("libnss3")
    fonts = os.path.join(roots["fonts-dejavu-core"], FONTS_DIR)
    for name in sorted(os.listdir(fonts)):
        if name.endswith(".ttf"):
            tree[f"fonts/{name}"] = os.path.join(fonts, name)
    used.add("fonts-dejavu-core")
    return tree, used


RECIPE = Recipe(
    kind="browser",
    entry="chrome",
    packages=ROOT_PACKAGES,
    common_packages=("fonts-dejavu-core",),
    plan=plan,
    library_dirs=(CHROMIUM_DIR,),
)

if __name__ == "__main__":
    main(RECIPE, sys.argv[1:])
