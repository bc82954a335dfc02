#!/usr/bin/env bash
# A real 1-GPU PyTorch training job started and stopped through trainctl (a machine with
# an NVIDIA GPU and a CUDA build of torch; trainctl and python3 on PATH). The job saves
# its checkpoint on its own schedule and has no signal handler (scripts/gpu_smoke_train.py).
# Checks: start --gpus 0, status sees steps and a complete checkpoint, `gpus` attributes
# the process, stop proves the memory released, a restart resumes from the checkpoint.
# Prints PASS/FAIL per check; < 2 min.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
export TRAINCTL_HOME="$work/home" W="$work"
unset TRAINCTL_FAKE_GPU
fails=0
check() {
  local name="$1"; shift
  if "$@"; then echo "PASS  $name"; else echo "FAIL  $name"; fails=$((fails + 1)); fi
}
py() { python3 -c "$@"; }
check "start --gpus 0 a torch trainer" trainctl start --name train --gpus 0 --grace 20 \
  --set "checkpoint=$work/out/ckpt.pt" --set 'progress_regex=step (?P<step>\d+)' \
  -- python3 "$ROOT/scripts/gpu_smoke_train.py" "$work/out" --resume
for _ in $(seq 1 120); do  # CUDA init, then 50 steps to the first checkpoint
  trainctl status train --json > "$work/st.json" 2>/dev/null
  py "import json,sys; d=json.load(open('$work/st.json')); sys.exit(0 if (d.get('checkpoint') or {}).get('step') else 1)" && break
  sleep 0.5
done
trainctl status train
check "status: a complete checkpoint with its step, and progress" py "
import json
d = json.load(open('$work/st.json'))
ck, p = d.get('checkpoint') or {}, d.get('progress') or {}
print('  checkpoint', ck.get('path'), 'step', ck.get('step'), '| progress step', p.get('step'))
raise SystemExit(0 if ck.get('step') and p.get('step') else 1)"
trainctl gpus --json > "$work/gpus.json"
trainctl gpus
check "gpus: GPU 0 leased by the job, its process attributed" py "
import json
g = [g for g in json.load(open('$work/gpus.json')) if g['index'] == 0][0]
ours = [p for p in g['processes'] if p['owner'] == 'train']
print('  lease', g['leased_by'], 'processes', [(p['pid'], p.get('used_bytes')) for p in ours])
raise SystemExit(0 if g['leased_by'] == 'train' and ours else 1)"
trainctl stop train --json > "$work/stop.json"; rc=$?
trainctl stop train
check "stop exits 0: nothing of the job alive, GPU 0 proven released" test "$rc" -eq 0
check "stop report: GPU 0 ok" py "
import json
r = json.load(open('$work/stop.json'))['report']
g = r['gpus'][0]
print('  released %.2f GiB in %.2f s; cause: %s; waited for a save: %s' % (g.get('released_bytes', 0) / 2**30, g.get('seconds') or -1, (r.get('cause') or {}).get('summary'), r.get('save_waited_s')))
raise SystemExit(0 if g['ok'] else 1)"
ls -l "$work/out"
check "the checkpoint the stop left is whole (torch.load reads it)" py "
import torch
s = torch.load('$work/out/ckpt.pt', map_location='cpu', weights_only=True)
print('  checkpoint step', s['step'])"
check "restart resumes from the checkpoint" trainctl restart train
for _ in $(seq 1 60); do grep -q "resumed from step" "$TRAINCTL_HOME/jobs/train/logs/run-2.log" 2>/dev/null && break; sleep 0.5; done
check "run 2 says it resumed" grep -m1 "resumed from step" "$TRAINCTL_HOME/jobs/train/logs/run-2.log"
tail -5 "$TRAINCTL_HOME/jobs/train/logs/run-2.log"
trainctl status train | head -12
check "stop of run 2" trainctl stop train
echo "== $fails check(s) failed"
[ "$fails" -eq 0 ]
