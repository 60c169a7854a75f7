#!/usr/bin/env bash
# Set up (if needed), lint with ruff, run the test suite, then check a core-only install (scripts/core_install.sh)
# and run the verl tests in verl's own environment (scripts/setup_verl.sh).
# Extra arguments go to pytest (e.g. -m "not slow").
# Run as root, the sandbox and integrity tests then run again as an ordinary user (tests/as_user.py), so the
# sandbox is checked both ways: root (cells as a throwaway uid) and a normal user (cells as that user).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# lint first, but run the tests either way; the command fails if any part fails
lint=0
.venv/bin/ruff check . || lint=$?
tests=0
.venv/bin/python -m pytest "$@" || tests=$?
# a core-only install (no extras) in a fresh virtualenv: import, a Calculator-v0 episode, missing-extra messages
core=0
bash scripts/core_install.sh || core=$?
# turngym inside verl: verl 0.9.1 lives in its own environment (.venv-verl, its pins conflict with `all`);
# tests/verl/ runs there (the main suite leaves it out: tests/conftest.py)
verl=0
bash scripts/setup_verl.sh && .venv-verl/bin/python -m pytest -q -p no:cacheprovider tests/verl || verl=$?
as_user=0
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1; then
  echo "sandbox and integrity tests as an ordinary user (uid 61234):"
  .venv/bin/python tests/as_user.py 61234 .venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/test_sandbox.py tests/test_sandbox_isolation.py tests/test_integrity.py || as_user=$?
fi
[ "$lint" = 0 ] && [ "$tests" = 0 ] && [ "$core" = 0 ] && [ "$verl" = 0 ] && [ "$as_user" = 0 ]
