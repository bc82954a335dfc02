#!/usr/bin/env bash
# Install trainctl with its test dependencies into .venv and run the whole test suite
# (real processes, PyTorch, sshd, Slurm). `--fast` leaves out the tests marked slow (real
# frameworks, sshd, Slurm) for quick iteration. Other arguments go to pytest
# (e.g. scripts/test.sh -k stop -x).
#
# Four pytest-xdist workers by default (TEST_WORKERS=0: none, N: N), each given whole
# files (--dist loadfile), so a module's own Slurm cluster, sshd or systemd bed is built
# once, in one worker. The tests mostly wait on real processes (a run uses ~40 % of two
# cores with two workers): four workers on two cores took the suite from ~12 to ~6.5
# minutes here, and the busier machine is part of what it proves (docs/development.md).
set -euo pipefail
EXTRAS=test . "$(dirname "$0")/_venv.sh"
cd "$ROOT"
args=()
for a in "$@"; do
  if [ "$a" = --fast ]; then args+=(-m "not slow"); else args+=("$a"); fi
done
workers="${TEST_WORKERS:-4}"
if [ "$workers" != 0 ]; then args=(-n "$workers" --dist loadfile "${args[@]}"); fi
exec python -m pytest "${args[@]}"
