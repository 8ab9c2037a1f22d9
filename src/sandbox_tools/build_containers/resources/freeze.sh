#!/bin/sh
# Runs inside the builder container (no network). Inputs, copied in before the start
# (not bind-mounted, so the engine may be remote); /out is copied back after the exit:
#   /src        the package's parent directory
#   /wheelhouse the build dependencies (downloaded on the host)
#   /wheelhouse-staticx  staticx and its dependencies (FORMAT=staticx only)
#   /recipe     this directory
#   /out        results: runtime/ (onedir tree + lib/), launcher; _build_info.json is an input
# FORMAT=portable|staticx selects what is frozen.
set -eu
: "${FORMAT:?}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-315532800}" PYTHONHASHSEED=0
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
work=/tmp/build
rm -rf "$work" && mkdir -p "$work/src"
step() { echo "::stage:: $*"; }

step "dependencies"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --no-index --find-links /wheelhouse --require-hashes \
  -r /recipe/freeze.lock
if [ "$FORMAT" = staticx ]; then
  # No aarch64 wheel: there staticx builds from its sdist with the builder's scons.
  "$work/venv/bin/pip" install --quiet --no-index --find-links /wheelhouse-staticx \
    --require-hashes --no-build-isolation -r /recipe/staticx.lock
fi

step "freeze"
cp -r /src/sandbox_tools "$work/src/"
cp /out/_build_info.json "$work/src/sandbox_tools/runtime/_build_info.json"
mode=--onedir
[ "$FORMAT" = staticx ] && mode=--onefile
# The runtime is standard library only; leave out what it never imports. asyncio and
# hashlib import ssl/_hashlib optionally: without them 5 MB of OpenSSL stay out.
"$work/venv/bin/pyinstaller" --noconfirm --clean --log-level WARN "$mode" --name runtime \
  --distpath "$work/dist" --workpath "$work/work" --specpath "$work" --paths "$work/src" \
  --add-data "$work/src/sandbox_tools/runtime/_build_info.json:sandbox_tools/runtime" \
  --exclude-module tkinter --exclude-module unittest --exclude-module pydoc \
  --exclude-module doctest --exclude-module sqlite3 --exclude-module lib2to3 \
  --exclude-module ensurepip --exclude-module idlelib --exclude-module distutils \
  --exclude-module ssl --exclude-module _ssl --exclude-module _hashlib \
  /recipe/entry.py

step "bundle"
if [ "$FORMAT" = portable ]; then
  python3 /recipe/bundle_libs.py "$work/dist/runtime"
  musl-gcc -static -Os -s -o "$work/dist/launcher" /recipe/launcher.c
  cp -a "$work/dist/runtime" "$work/dist/launcher" /out/
else
  "$work/venv/bin/staticx" --strip "$work/dist/runtime" /out/runtime.staticx
fi
echo "::done::"
