#!/usr/bin/env bash
# Which of the packages setup.sh needs can be installed here: reads package names on
# stdin (one a line), prints "install NAME" or "skip NAME: why" for each. A package
# this distribution does not have is skipped only when it is optional (what then goes
# untested is said); a required one that is missing is an error (exit 3).
# SETUP_AVAILABLE_PACKAGES names a file of package names to use instead of apt-cache
# (tests/local/test_setup_packages.py runs it with Ubuntu's names).
set -euo pipefail

# Optional: the suite runs without them, and this says what skips.
declare -A OPTIONAL=(
  [chromium-headless-shell]="tests/local/test_web_browser*.py and test_browser_mcp.py skip (Ubuntu ships Chromium as a snap; the container tests use the browser add-on)"
)

available() {
  if [ -n "${SETUP_AVAILABLE_PACKAGES:-}" ]; then
    grep -qx -- "$1" "$SETUP_AVAILABLE_PACKAGES"
  else
    [ -n "$(apt-cache policy -- "$1" 2>/dev/null | sed -n 's/^  Candidate: //p' | grep -v '(none)')" ]
  fi
}

status=0
while read -r name; do
  [ -n "$name" ] || continue
  if available "$name"; then
    echo "install $name"
  elif [ -n "${OPTIONAL[$name]:-}" ]; then
    echo "skip $name: not in this distribution's packages; ${OPTIONAL[$name]}"
  else
    echo "skip $name: not in this distribution's packages, and the suite needs it" >&2
    status=3
  fi
done
exit "$status"
