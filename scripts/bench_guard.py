"""What the checkpoint guard costs a start, and how fast it stops a run that started over.

1. `trainctl start --no-wait` of a nanoGPT-shaped job (ckpt.pt rewritten in place, a zip),
   until main has exec'd, median of ROUNDS: with no checkpoint glob; with a glob and
   `--from-scratch` (no guard); guarded, with a 1 MiB, a 64 MiB and a 256 MiB checkpoint
   (this file system has no reflinks: a copy, bounded by KEEP_COPY_S).
2. The trip: a run that starts over writes its first step line at T (its own clock);
   the time from T to the SIGKILL the guard's stop sends, median of ROUNDS.

    bash scripts/bench.sh --guard      # ~1 min
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROUNDS = 5
TRAINER = """\
import json, os, sys, time
print("up", flush=True)
with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:  # starts over: step 1
    f.write(json.dumps({"step": 1, "t": time.time()}) + "\\n")
time.sleep(600)
"""


def tc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["trainctl", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def wait(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def state(home: Path, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((home / "jobs" / name / "state.json").read_text())


def checkpoint(d: Path, size: int) -> None:
    (d / "out").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(d / "out" / "ckpt.pt", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", json.dumps({"iter_num": 1050}))
        z.writestr("archive/data/0", os.urandom(size))
    # its step, as the trainer's own record says it (trainer.mark_complete(path, step))
    (d / "out" / "ckpt.pt.complete").write_text(json.dumps({"step": 1050}))


def start_ms(env: dict[str, str], home: Path, d: Path, *extra: str) -> tuple[float, dict]:  # type: ignore[type-arg]
    """One start until main exec'd (the CLI's own figure), then a stop."""
    res = tc(env, "start", "--name", "g", "--cwd", str(d), "--no-wait", "--json", *extra,
             "--", sys.executable, "-c", "import time; time.sleep(600)")  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(res.stderr)
    doc = json.loads(res.stdout)
    tc(env, "stop", "g")
    return doc["elapsed_s"] * 1000, doc


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    home = tmp / "home"
    env = {**os.environ, "TRAINCTL_HOME": str(home), "TRAINCTL_START_WATCH": "0"}
    d = tmp / "job"
    d.mkdir()
    glob = ["--set", "checkpoint=out/ckpt.pt"]
    rows = []
    times = [start_ms(env, home, d)[0] for _ in range(ROUNDS)]
    rows.append(("no checkpoint glob", statistics.median(times), "-"))
    for size_mib in (1, 64, 256):
        checkpoint(d, size_mib << 20)
        times = [start_ms(env, home, d, *glob, "--from-scratch")[0] for _ in range(ROUNDS)]
        rows.append((f"{size_mib} MiB, --from-scratch", statistics.median(times), "-"))
        got = [start_ms(env, home, d, *glob) for _ in range(ROUNDS)]
        g = got[-1][1]["guard"] or {}
        how = g.get("kept_how") or f"not kept: {g.get('not_kept')}"
        rows.append((f"{size_mib} MiB, guarded", statistics.median(t for t, _ in got), how))
    base = rows[0][1]
    print(f"{'start --no-wait until exec':<34} {'median':>9} {'vs no glob':>10}  kept")
    for what, ms, how in rows:
        print(f"{what:<34} {ms:>7.0f} ms {ms / base:>9.2f}x  {how}")
    trips = []
    for _ in range(ROUNDS):
        res = tc(env, "start", "--name", "g", "--cwd", str(d), *glob, "--no-wait",
                 "--", sys.executable, "-c", TRAINER)  # fmt: skip
        if res.returncode != 0:
            raise SystemExit(res.stderr)
        run = state(home, "g")["run"]
        wait(lambda: state(home, "g")["phase"] == "failed", 30, "the guard to stop it")
        lines = (home / "jobs" / "g" / "logs" / f"run-{run}.progress.jsonl").read_text()
        first = json.loads(lines.splitlines()[0])["t"]
        events = [json.loads(x) for x in (home / "jobs" / "g" / "events.jsonl").read_text()
                  .splitlines()]  # fmt: skip
        sent = [e["ts"] for e in events if e["event"] == "stop_report"][-1]
        trips.append((sent - first) * 1000)
    print(
        f"first step below the floor -> the stop's report: median {statistics.median(trips):.0f}"
        f" ms ({', '.join(f'{t:.0f}' for t in trips)})"
    )


if __name__ == "__main__":
    main()
