#!/usr/bin/env bash
# Set the machine up, then run the main job: start a runtime server on this machine and
# stream a command through exec_remote, printing its output and a summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/tools exec-remote 'echo "hello from exec_remote in $(uname -sm)"; echo "(stderr works too)" >&2'
