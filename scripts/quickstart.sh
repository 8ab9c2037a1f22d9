#!/usr/bin/env bash
# Set the machine up, then run the main job end to end, offline:
#   1. build the runtime for this machine's architecture (tools build);
#   2. validate it across the offline distribution matrix (tools validate);
#   3. inject it into a fresh Debian container and stream one command through exec_remote.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
arch=$(uname -m)
.venv/bin/tools build --arch "$arch"
.venv/bin/tools validate --arch "$arch"
.venv/bin/tools exec-remote --distro debian-12 \
  'echo "hello from exec_remote in $(. /etc/os-release; echo "$PRETTY_NAME") on $(uname -m)"'
