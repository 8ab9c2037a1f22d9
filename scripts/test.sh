#!/usr/bin/env bash
# The full test suite: lint, type-check, unit tests, and integration tests on a real
# Docker engine (set up first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SANDBOX_TOOLS_REQUIRE_DOCKER=1  # no silent skips of the real-container tests
# arm64 artifacts are built and run under QEMU: ~20 min on a cold machine, seconds warm.
export SANDBOX_TOOLS_TEST_ARM64="${SANDBOX_TOOLS_TEST_ARM64:-1}"
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
.venv/bin/lint-imports  # the layers in pyproject.toml: no import runs back up
status=0
# Parallel workers (pytest-xdist): the suite mostly waits on containers, so more workers
# than cores pay; a module is one unit of work (tests/conftest.py). Extra arguments come
# last, so `-n 0` runs it in one process; the 25 slowest steps are listed at the end. Tracebacks are Python's own (--tb=native):
# pytest's source excerpts parse code with `ast`, which on CPython 3.11.7 can fail with
# "AST constructor recursion depth mismatch" while another thread parses too, and that
# ended a worker, and the run, while it reported a failure.
.venv/bin/pytest -ra -n "${SANDBOX_TOOLS_TEST_WORKERS:-4}" --dist loadscope --tb=native --durations=25 "$@" || status=$?
if [ "$status" = 5 ]; then
  echo "pytest collected no tests (exit 5): nothing was tested, which is a failure" >&2
fi
exit "$status"
