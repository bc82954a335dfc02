#!/usr/bin/env bash
# Run the benchmarks of docs/performance.md (installs `supervisor` for the
# side-by-side `supervisorctl status` figure). Arguments go to bench_stop.py.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
_pip supervisor
exec python "$ROOT/scripts/bench_stop.py" "$@"
