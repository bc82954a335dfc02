#!/usr/bin/env bash
# Install trainctl with its test dependencies into .venv and run the whole test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k stop -x).
set -euo pipefail
EXTRAS=test . "$(dirname "$0")/_venv.sh"
cd "$ROOT"
exec python -m pytest "$@"
