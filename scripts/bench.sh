#!/usr/bin/env bash
# Run the benchmarks of docs/performance.md (installs `supervisor` for the
# side-by-side `supervisorctl status` figure). Arguments go to bench_stop.py;
# `--deploy` runs the deploy benchmarks (scripts/bench_deploy.py) instead.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
if [ "${1:-}" = "--deploy" ]; then
  exec python "$ROOT/scripts/bench_deploy.py"
fi
_pip supervisor
exec python "$ROOT/scripts/bench_stop.py" "$@"
