#!/usr/bin/env bash
# Set up (if needed), lint with ruff and run the test suite. Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# lint first, but run the tests either way; the command fails if either fails
lint=0
.venv/bin/ruff check . || lint=$?
.venv/bin/python -m pytest "$@"
exit "$lint"
