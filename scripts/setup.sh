#!/usr/bin/env bash
# Idempotent machine setup for sandbox-tools on Debian/Ubuntu:
#   - system packages: a Docker engine, QEMU user emulation + binfmt (arm64 containers),
#     debootstrap (offline base images), musl-tools (the static launcher),
#     chromium-headless-shell (the web browser tool's local tests);
#   - a running Docker engine (started in the background when none answers);
#   - .venv with the package and its dev tools.
# Safe to rerun: every step checks first and does nothing when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
# debootstrap checks Debian's signatures with it (Ubuntu's debootstrap does not pull it in).
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
# Builds as a user run debootstrap through `sudo -n`, as on GitHub's runners (a test does).
command -v sudo >/dev/null || missing+=(sudo)
[ -e /usr/bin/qemu-aarch64-static ] || [ -e /usr/bin/qemu-aarch64 ] || missing+=(qemu-user-static)
command -v update-binfmts >/dev/null || missing+=(binfmt-support)
command -v musl-gcc >/dev/null || missing+=(musl-tools)
command -v gcc >/dev/null || missing+=(gcc)  # tests build a small preload library
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
# The web browser tool's tests on this machine (tests/local/test_web_browser.py) drive
# Debian's Chromium headless shell, the browser the tool starts by default; container
# tests will use the browser add-on instead.
[ -x /usr/lib/chromium/chromium-headless-shell ] || missing+=(chromium-headless-shell)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  # Only what this distribution has (Ubuntu has no chromium-headless-shell package):
  # an optional package it lacks is skipped with what then goes untested.
  chosen=$(printf '%s\n' "${missing[@]}" | bash scripts/setup_packages.sh) || exit 3
  install=()
  while read -r verdict name rest; do
    case "$verdict" in
      install) install+=("$name") ;;
      skip) log "skipping ${name%:}:$rest" ;;
    esac
  done <<<"$chosen"
  if [ ${#install[@]} -gt 0 ]; then
    log "installing ${install[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${install[@]}" >/dev/null
  fi
fi

# binfmt_misc: lets the engine run linux/arm64 containers under QEMU.
if [ -d /proc/sys/fs/binfmt_misc ] && [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  $SUDO mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  $SUDO update-binfmts --enable >/dev/null 2>&1 || log "warning: could not enable binfmt (arm64 containers will not run)"
fi

if ! docker info >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ]; then
    echo "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST" >&2
    exit 3
  fi
  log "starting dockerd in the background (log: /var/log/sandbox-tools-dockerd.log)"
  $SUDO sh -c 'nohup dockerd >/var/log/sandbox-tools-dockerd.log 2>&1 &'
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not come up; see /var/log/sandbox-tools-dockerd.log" >&2; exit 3; }
fi

# The virtual environment, reinstalled only when pyproject.toml or the constraints change.
stamp=".venv/.installed-$(cat pyproject.toml constraints-dev.txt | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  log "creating .venv and installing sandbox-tools[dev]"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -c constraints-dev.txt -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
log "ready: $(.venv/bin/tools --version), Docker $(docker version --format '{{.Server.Version}}')"
