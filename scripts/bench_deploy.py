"""Deploy benchmarks (issue 35), printed as ratios; run by scripts/bench.sh --deploy.

1. A git snapshot of a 30,000-file repository (launcher/snapshot.py) against
   a bare ``git worktree add --detach`` of the same commit (target: <= 2 s, <= 1.2x).
2. The overhead of `trainctl deploy` beyond the job's own stop and start: a deploy
   (``--at now``) against a `trainctl restart --health 0` of the same job, interleaved,
   less the time the new run itself takes to report two steps (the gate's own wait).
   Target: <= 1.5 s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainctl.launcher import snapshot
from trainctl.supervisor.model.spec import SnapshotPolicy, Spec

GIT = ["git", "-c", "user.email=b@b", "-c", "user.name=b"]
TRAINCTL = [sys.executable, "-m", "trainctl.launcher"]
JOB = """\
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
step = 0
while True:
    step += 1
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    time.sleep(0.02)
"""


def big_repo(root: Path, files: int) -> Path:
    repo = root / "big"
    for i in range(files):
        d = repo / f"pkg{i % 300:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_text(f"X = {i}\n")
    subprocess.run([*GIT, "-C", str(repo), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "big"], check=True)
    (repo / "pkg000" / "m0.py").write_text("X = 'dirty'\n")  # a dirty tree, as users have
    return repo


def bench_snapshot(root: Path, files: int, rounds: int) -> None:
    repo = big_repo(root, files)
    spec = Spec(name="b", argv=("python",), cwd=str(repo), env={})
    spec = dataclasses.replace(spec, snapshot=SnapshotPolicy(mode="git"))
    ours, bare = [], []
    for i in range(rounds):
        jdir = root / f"job{i}"
        jdir.mkdir()
        t0 = time.perf_counter()
        snapshot.make(jdir, spec, 1)
        ours.append(time.perf_counter() - t0)
        dest = root / f"bare{i}"
        t0 = time.perf_counter()
        git = ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(dest), "HEAD"]
        subprocess.run(git, check=True)
        bare.append(time.perf_counter() - t0)
    o, b = statistics.median(ours), statistics.median(bare)
    print(
        f"1. git snapshot of a {files}-file repository (dirty), median of {rounds}: "
        f"{o:.2f} s (target <= 2 s); bare `git worktree add` {b:.2f} s -> {o / b:.2f}x "
        "(target <= 1.2x)"
    )


def _tc(env: dict[str, str], *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([*TRAINCTL, *args], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _second_step_after_start(home: Path, run: int) -> float:
    """Seconds from the run's `started` event to its second progress line."""
    jdir = home / "jobs" / "dep"
    events = [json.loads(x) for x in (jdir / "events.jsonl").read_text().splitlines()]
    started = [e["ts"] for e in events if e.get("event") == "started" and e.get("run") == run]
    lines = (jdir / "logs" / f"run-{run}.progress.jsonl").read_text().splitlines()
    return float(json.loads(lines[1])["t"]) - started[-1]


def bench_deploy(root: Path, rounds: int) -> None:
    repo = root / "small"
    repo.mkdir()
    (repo / "train.py").write_text(JOB)
    subprocess.run([*GIT, "-C", str(repo), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "v0"], check=True)
    home = root / "home"
    env = {**os.environ, "TRAINCTL_HOME": str(home)}
    _tc(env, "start", "--name", "dep", "--cwd", str(repo), "--set", "snapshot=git",
        "--", sys.executable, "train.py")  # fmt: skip
    time.sleep(0.5)
    deploys, restarts = [], []
    for i in range(rounds):
        (repo / "train.py").write_text(JOB + f"# v{i + 1}\n")
        subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", f"v{i + 1}"], check=True)
        took = _tc(env, "deploy", "dep", "--at", "now", "--health", "60s")
        run = json.loads((home / "jobs" / "dep" / "state.json").read_text())["run"]
        deploys.append(took - _second_step_after_start(home, run))
        restarts.append(_tc(env, "restart", "dep", "--health", "0"))
        time.sleep(0.3)
    _tc(env, "stop", "dep")
    d, r = statistics.median(deploys), statistics.median(restarts)
    print(
        f"2. deploy (--at now, git snapshot) less the new run's own time to its 2nd step, "
        f"median of {rounds}: {d:.2f} s; `restart --health 0` of the same job {r:.2f} s -> "
        f"overhead {d - r:.2f} s (target <= 1.5 s)"
    )


def main() -> None:
    files = int(os.environ.get("BENCH_DEPLOY_FILES", "30000"))
    with tempfile.TemporaryDirectory() as tmp:
        bench_snapshot(Path(tmp), files, 3)
        bench_deploy(Path(tmp), 3)


if __name__ == "__main__":
    main()
