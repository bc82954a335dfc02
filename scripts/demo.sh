#!/usr/bin/env bash
# Quickstart demo: install trainctl into .venv, start the demo trainer detached, look at it,
# stop it (SIGTERM -> checkpoint -> verified exit), print the stop report.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
cd "$ROOT"
export TRAINCTL_HOME="${TRAINCTL_HOME:-$ROOT/demo-home}"
work="$TRAINCTL_HOME/demo-work"
mkdir -p "$work"
name=demo
if trainctl status "$name" >/dev/null 2>&1; then trainctl stop "$name" >/dev/null; fi

echo "== trainctl start -c conf/jobs/demo.toml (returns as soon as the job has exec'd)"
trainctl start -c "$ROOT/conf/jobs/demo.toml" --name "$name" --cwd "$work" -- \
  python "$ROOT/scripts/demo_trainer.py" --out "$work/checkpoints" --ckpt-seconds 1 --helpers
for _ in $(seq 1 100); do   # wait for the first few training lines (max ~10 s)
  [ "$(trainctl logs "$name" | grep -c '^step')" -ge 3 ] && break
  sleep 0.1
done
echo; echo "== trainctl status $name"
trainctl status "$name"
echo; echo "== trainctl ps $name"
trainctl ps "$name"
echo; echo "== trainctl logs $name -n 3"
trainctl logs "$name" -n 3
echo; echo "== trainctl stop $name --checkpoint --grace 3"
echo "   (SIGUSR2 -> a new checkpoint; SIGTERM to the top of the tree first, so the ranks"
echo "   finish with their loaders alive; the setsid'd uploader is found by its marker; the"
echo "   stuck prefetcher ignores SIGTERM and is named when it gets SIGKILL after 3 s)"
trainctl stop "$name" --checkpoint --grace 3
echo; echo "== last lines of the log, and the checkpoint"
trainctl logs "$name" -n 2
cat "$work/checkpoints/checkpoint.json"; echo
echo; echo "State and logs: $TRAINCTL_HOME/jobs/$name"
echo "Delete them with: TRAINCTL_HOME=$TRAINCTL_HOME .venv/bin/trainctl rm $name"
