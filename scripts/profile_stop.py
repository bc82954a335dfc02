#!/usr/bin/env python3
"""Where the supervisor's stop of the big tree spends its time (issue 45: "profile it and
say where the time goes"). Prints a profile; asserts nothing.

Each round starts the 241-process tree of scripts/bench_stop.py as job `bench`, waits
until the supervisor's snapshot holds all of it (where the stop of any job that ran a
while starts), attaches py-spy to the supervisor (non-blocking, 2000 samples a second;
idle threads are not sampled, so only the stop's own work is counted), and stops the
job. The samples of every round are added up, then shown three ways:

- by phase: the frame of supervisor/tree/terminate.py (or stop.py) nearest the top of
  each sample: the stop's own steps (signal, wait, verify), and what ran outside them;
- by function, self time: where the CPU actually was;
- by thread: the event loop against the stop's worker thread.

Run: scripts/profile_stop.py [--rounds 10]  (after `. scripts/_venv.sh`)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stop import stop_every_job, tc, trainctl_tree  # the bench's tree, start, cleanup

RATE = 2000  # samples a second
PHASE_FILES = ("supervisor/tree/terminate.py", "supervisor/tree/stop.py")


def one_round(tmp: Path, env: dict[str, str], width: int, depth: int, spy: str) -> Path:
    """Start, settle, attach py-spy, stop; the round's collapsed stacks."""
    trainctl_tree(tmp, env, width, depth, settle=True)
    st = json.loads((Path(env["TRAINCTL_HOME"]) / "jobs" / "bench" / "state.json").read_text())
    sup = st["supervisor"]["pid"]
    out = tmp / f"stacks-{time.monotonic_ns()}.txt"
    rec = subprocess.Popen(
        [spy, "record", "--pid", str(sup), "--rate", str(RATE), "--nonblocking", "--threads",
         "--full-filenames", "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy is attached and sampling
    r = tc("stop", "bench", "--json", env=env)
    if r.returncode:
        raise SystemExit(f"bad stop: {r.stdout[:300]} {r.stderr}")
    try:
        rec.wait(timeout=30)  # it ends with the supervisor
    except subprocess.TimeoutExpired:
        rec.terminate()  # our own child
        rec.wait()
    if not out.exists():
        raise SystemExit(f"py-spy wrote nothing: {rec.stderr.read() if rec.stderr else ''}")
    return out


def frames(line: str) -> tuple[list[str], int]:
    """A raw py-spy line: its frames (outermost first) and its sample count."""
    stack, _, count = line.rpartition(" ")
    return stack.split(";"), int(count)


def where(frame: str) -> str:
    """``fn (file.py:12)`` -> ``file.py:fn`` (py-spy's raw frame, line number dropped)."""
    name, _, loc = frame.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    for root in ("supervisor/", "launcher/"):
        if f"/{root}" in path:
            path = root + path.split(f"/{root}", 1)[1]
            break
    else:
        path = os.path.basename(path)
    return f"{path}:{name}"


def thread_of(stack: list[str]) -> str:
    """The event loop (the main thread) or a worker thread (the stop runs in one)."""
    outer = where(stack[1]) if len(stack) > 1 else ""
    return "worker thread" if "Thread._bootstrap" in outer else "event loop (main thread)"


def phase_of(stack: list[str]) -> str:
    """The innermost frame of the stop's own files, else the thread's outermost frame."""
    for frame in reversed(stack):
        w = where(frame)
        if w.startswith(PHASE_FILES):
            return w
    inner = [where(f) for f in stack[1:] if "supervisor/" in where(f)]
    return "outside the stop: " + (inner[-1] if inner else where(stack[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--width", type=int, default=200)
    ap.add_argument("--depth", type=int, default=40)
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed (scripts/_venv.sh installs it)")
    by_phase: collections.Counter[str] = collections.Counter()
    by_self: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="tc-profile-") as d:
        tmp = Path(d)
        env = {**os.environ, "TRAINCTL_HOME": str(tmp / "home")}
        try:
            for _ in range(args.rounds):
                stacks = one_round(tmp, env, args.width, args.depth, spy).read_text()
                for line in stacks.splitlines():
                    stack, n = frames(line)
                    by_thread[thread_of(stack)] += n
                    by_phase[phase_of(stack)] += n
                    by_self[where(stack[-1])] += n
        finally:  # a round that failed midway leaves its job: stop it (by its marker)
            stop_every_job(tmp)
    total = sum(by_phase.values())
    ms = 1000 / RATE / args.rounds  # one sample, in ms of one stop
    print(f"{total} samples over {args.rounds} stops: {total * ms:.1f} ms of work a stop")
    for title, counter, k in (("by thread", by_thread, 4), ("by phase", by_phase, 14),
                              ("by function (self)", by_self, 20)):  # fmt: skip
        print(f"\n{title}:")
        for key, n in counter.most_common(k):
            print(f"  {n * ms:6.1f} ms  {100 * n / total:4.1f} %  {key}")


if __name__ == "__main__":
    main()
