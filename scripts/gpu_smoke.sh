#!/usr/bin/env bash
# GPU smoke check for a machine with an NVIDIA GPU and PyTorch (CUDA build):
# a job of three GPU processes (one forked child, one setsid-escaped) started through
# trainctl with --gpus 0; checks that `trainctl gpus` attributes them, stops the job and
# checks the stop report proves the memory released. Prints PASS/FAIL per check; < 3 min.
# Usage: scripts/gpu_smoke.sh [--double] [GIB_PER_PROCESS]   (the trainctl and python on PATH)
#
# --double: the same checks on a machine without a GPU, against the C double of
# libnvidia-ml.so.1 (tests/gpu/nvml_double.c, built here with cc) that the real
# nvidia-ml-py loads; the job's processes then "allocate" by keeping the double's device
# node open instead of through torch. CI runs this mode (tests/gpu/test_nvml_double.py).
set -uo pipefail
double=0
if [ "${1:-}" = --double ]; then double=1; shift; fi
GIB="${1:-2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
export TRAINCTL_HOME="$work/home" SMOKE_DIR="$work" SMOKE_GIB="$GIB"
unset TRAINCTL_FAKE_GPU
if [ "$double" = 1 ]; then
  mkdir -p "$work/lib" "$work/dev" && touch "$work/dev/nvidia0"
  cc -shared -fPIC -O1 -o "$work/lib/libnvidia-ml.so.1" "$ROOT/tests/gpu/nvml_double.c" || exit 1
  cat >"$work/nvml.json" <<EOF
{"driver_version": "550.54.15", "nvml_version": "12.550.54.15",
 "devices": [{"uuid": "GPU-5a0ce000-0000-4000-8000-000000000000", "name": "NVIDIA H200",
              "minor": 0, "total": 151397597184, "used": 536870912,
              "node": "$work/dev/nvidia0", "release_delay_s": 1}]}
EOF
  export LD_LIBRARY_PATH="$work/lib" NVML_DOUBLE="$work/nvml.json"
  export TRAINCTL_NVIDIA_DEV_DIR="$work/dev" SMOKE_DEVICE="$work/dev/nvidia0" NVML_DOUBLE_DEV="$work/dev"
  FAKE_GPU_MIB="$(python3 -c "print(int(float('$GIB') * 1024))")"
  export FAKE_GPU_MIB
fi
fails=0
check() {  # check NAME CONDITION-COMMAND...
  local name="$1"; shift
  if "$@"; then echo "PASS  $name"; else echo "FAIL  $name"; fails=$((fails + 1)); fi
}
py() { python3 -c "$@"; }

if [ "$double" = 1 ]; then
  echo "== machine: no GPU; the libnvidia-ml double at $work/lib"
else
  echo "== machine"; nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv || true
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
fi

check "trainctl gpus sees an NVIDIA driver" \
  bash -c 'trainctl gpus --json > "$SMOKE_DIR/gpus0.json" && ! grep -q "no NVIDIA driver" "$SMOKE_DIR/gpus0.json"'
check "start --gpus 0 (returns once exec'd)" \
  trainctl start --name gpu-smoke --gpus 0 --grace 20 -- python3 "$ROOT/scripts/gpu_smoke_job.py"
for _ in $(seq 1 120); do   # CUDA init + allocation: up to 60 s
  [ -f "$work/main.ready" ] && [ -f "$work/child.ready" ] && [ -f "$work/escaped.ready" ] && break
  sleep 0.5
done
check "three processes allocated ${GIB} GiB each" \
  test -f "$work/main.ready" -a -f "$work/child.ready" -a -f "$work/escaped.ready"
trainctl gpus --json > "$work/gpus1.json"
trainctl gpus
check "trainctl gpus attributes all three to the job" py "
import json
g = [g for g in json.load(open('$work/gpus1.json')) if g['index'] == 0][0]
pids = {int(open('$work/' + r + '.ready').read()) for r in ('main', 'child', 'escaped')}
ours = {p['pid'] for p in g['processes'] if p['owner'] == 'gpu-smoke'}
print('  job pids', sorted(pids), 'attributed', sorted(ours), 'lease', g['leased_by'])
raise SystemExit(0 if pids <= ours and g['leased_by'] == 'gpu-smoke' else 1)"
trainctl ps gpu-smoke
trainctl stop gpu-smoke --json > "$work/stop.json"; rc=$?
trainctl stop gpu-smoke >/dev/null 2>&1 || true
python3 -c "import json; d=json.load(open('$work/stop.json')); print(json.dumps(d['report'].get('gpus'), indent=1))"
check "stop exits 0 (nothing of the job alive, GPU released)" test "$rc" -eq 0
check "stop report: GPU 0 released >= $((GIB * 3 - 1)) GiB, back at its baseline" py "
import json
r = json.load(open('$work/stop.json'))['report']
g = r['gpus'][0]
print('  released %.1f GiB in %.1f s' % (g.get('released_bytes', 0) / 2**30, g.get('seconds', -1)))
raise SystemExit(0 if g['ok'] and g.get('released_bytes', 0) >= ($GIB * 3 - 1) * 2**30 else 1)"
echo "== $fails check(s) failed"
[ "$fails" -eq 0 ]
