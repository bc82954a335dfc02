#!/usr/bin/env bash
# Install trainctl with its test dependencies into .venv and run the whole test suite
# (real processes, PyTorch, sshd, Slurm). `--fast` leaves out the tests marked slow (real
# frameworks, sshd, Slurm) for quick iteration. Other arguments go to pytest
# (e.g. scripts/test.sh -k stop -x).
set -euo pipefail
EXTRAS=test . "$(dirname "$0")/_venv.sh"
cd "$ROOT"
args=()
for a in "$@"; do
  if [ "$a" = --fast ]; then args+=(-m "not slow"); else args+=("$a"); fi
done
exec python -m pytest "${args[@]}"
