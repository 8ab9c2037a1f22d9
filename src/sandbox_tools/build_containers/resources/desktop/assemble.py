"""The desktop add-on's tree: its recipe for `sandbox_tools.build_containers.debian_tree`.

Run with the builder's python3 (PYTHONPATH=/src, our ELF reader and packer copied in):

  lock ARCH OUT                                          (network; `addon --update-lock`)
  build ARCH DEBS OUT desktop=LAUNCHER lib/xkbcomp-shim.so=SHIM          (no network)

An X server without a screen (Xvfb), its keymap compiler, input (xdotool), a window
manager (twm) and a terminal (xterm), with the recursive DT_NEEDED closure of the five
and the data they read. Layout (every path relative to the tree):

  desktop                   the static launcher: `desktop PROGRAM ARG...`, the entry point
  ld-linux-*.so.*           glibc's loader, which runs every program of the tree
  bin/                      Xvfb, xkbcomp, xdotool, twm, xterm
  lib/                      their libraries, and xkbcomp-shim.so (Xvfb's keymap without
                            a shell: resources/desktop/xkbcomp_shim.c)
  share/xkb/                the keymaps (xkb-data), Xvfb's -xkbdir
  share/locale/             Xlib's locale tables: without them window titles and text vanish
  locale/C.utf8/            glibc's C.UTF-8, for typing beyond ASCII into the terminal
  app-defaults/XTerm        the terminal's resources (its menus)
  twmrc                     the window manager's configuration: nobody places windows
  fonts/, fonts.conf        DejaVu Sans Mono for the terminal, and its configuration
  licenses/<package>/       the copyright file of every package taken
  desktop.json              build id, platform, the packages and their versions
"""

from __future__ import annotations

import os
import sys

from sandbox_tools.build_containers.debian_tree import Recipe, Roots, Tree, main, needed

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = {
    "Xvfb": "xvfb",
    "xkbcomp": "x11-xkb-utils",
    "xdotool": "xdotool",
    "twm": "twm",
    "xterm": "xterm",
}
# tree directory -> (package, directory in it): taken whole, links followed.
DATA = {
    "share/xkb": ("xkb-data", "usr/share/X11/xkb"),
    "share/locale": ("libx11-data", "usr/share/X11/locale"),
    "locale/C.utf8": ("libc-bin", "usr/lib/locale/C.utf8"),
}
FONTS = ("DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf")
FONTS_DIR = "usr/share/fonts/truetype/dejavu"


def plan(roots: Roots, arch: str) -> tuple[Tree, set[str]]:
    tree: Tree = {name: os.path.join(HERE, name) for name in ("fonts.conf", "twmrc")}
    used: set[str] = set()
    for program, package in PROGRAMS.items():
        tree[f"bin/{program}"] = needed(roots[package], f"usr/bin/{program}")
        used.add(package)
    for into, (package, directory) in DATA.items():
        top = os.path.join(roots[package], directory)
        for walked, _, files in os.walk(top):
            for name in files:
                relative = os.path.relpath(os.path.join(walked, name), top)
                tree[f"{into}/{relative}"] = needed(roots[package], f"{directory}/{relative}")
        used.add(package)
    tree["app-defaults/XTerm"] = needed(roots["xterm"], "etc/X11/app-defaults/XTerm")
    for name in FONTS:
        tree[f"fonts/{name}"] = needed(roots["fonts-dejavu-core"], f"{FONTS_DIR}/{name}")
    used.add("fonts-dejavu-core")
    return tree, used


RECIPE = Recipe(
    kind="desktop",
    entry="desktop",
    packages=(*PROGRAMS.values(), "libc-bin"),
    common_packages=("xkb-data", "libx11-data", "fonts-dejavu-core"),
    plan=plan,
)

if __name__ == "__main__":
    main(RECIPE, sys.argv[1:])
