#!/usr/bin/env bash
# ruff (lint + format check) and mypy --strict on the installed packages.
set -euo pipefail
EXTRAS=test . "$(dirname "$0")/_venv.sh"
cd "$ROOT"
ruff check supervisor launcher tests scripts
ruff format --check supervisor launcher tests scripts
mypy -p trainctl.supervisor -p trainctl.launcher
