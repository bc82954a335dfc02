#!/usr/bin/env bash
# Run the benchmarks of docs/performance.md (installs `supervisor` for the
# side-by-side `supervisorctl status` figure). Arguments go to bench_stop.py;
# `--deploy` runs the deploy benchmarks (scripts/bench_deploy.py) instead, `--goodput`
# trainctl against plain torchrun under one fault schedule (scripts/bench_goodput.py), `--heal`
# a GPU fault to the healed run's first step (scripts/bench_heal.py), `--guard` the checkpoint
# guard's cost to a start and its trip (scripts/bench_guard.py), `--exit` a torchrun job's
# exit after its save (scripts/bench_exit.py), `--web` the web
# page's and the samples' (scripts/bench_web.py), `--fleet` the
# --all-hosts one (tests/remote/bench_fleet.py, on the remote tests' sshd).
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
if [ "${1:-}" = "--deploy" ]; then
  exec python "$ROOT/scripts/bench_deploy.py"
fi
if [ "${1:-}" = "--guard" ]; then  # what the checkpoint guard costs a start, how fast it trips
  exec python "$ROOT/scripts/bench_guard.py"
fi
if [ "${1:-}" = "--heal" ]; then  # a GPU fault to the healed run's first step (C NVML double)
  exec python "$ROOT/scripts/bench_heal.py"
fi
if [ "${1:-}" = "--goodput" ]; then  # a real torchrun job under faults (the torch extra)
  EXTRAS=test . "$(dirname "$0")/_venv.sh"
  exec python "$ROOT/scripts/bench_goodput.py" "${@:2}"  # --issue-schedule: issue 56's five
fi
if [ "${1:-}" = "--exit" ]; then  # a torchrun job's exit after its save, with gc.freeze() or not
  EXTRAS=test . "$(dirname "$0")/_venv.sh"
  exec python "$ROOT/scripts/bench_exit.py" "${@:2}"
fi
if [ "${1:-}" = "--web" ]; then  # the web page and the samples (needs the web extra)
  _pip -e "$ROOT[web]" --config-settings editable_mode=strict  # -e: the dev venv stays editable
  exec python "$ROOT/scripts/bench_web.py"
fi
if [ "${1:-}" = "--fleet" ]; then  # needs sshd (the remote tests' bed)
  cd "$ROOT" && exec python -m pytest -q -s -p no:cacheprovider tests/remote/bench_fleet.py
fi
_pip supervisor
exec python "$ROOT/scripts/bench_stop.py" "$@"
