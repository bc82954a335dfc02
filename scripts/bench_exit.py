"""How long a torchrun job takes to exit once its ranks have saved (docs/training.md).

The bench_goodput trainer (2 gloo ranks on CPU, nanoGPT's shape, its own SIGTERM handler)
under plain torchrun; each rank is sent SIGTERM (ours: the children of the torchrun this
script started), then timed until it is gone, and torchrun until it exits. Two arms in
turns: as the trainer is written, and with ``gc.freeze()`` after its final save
(BENCH_FREEZE_AT_EXIT=1), which keeps Python's last garbage collection off the objects
torch made. Prints the medians and their ratio.

    .venv/bin/python scripts/bench_exit.py [ROUNDS]
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINER = Path(__file__).parent / "bench_goodput_trainer.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def one(tmp: Path, freeze: bool) -> tuple[float, float]:
    """(the last rank gone, torchrun gone): seconds after the SIGTERM."""
    code, out = tmp / "code", tmp / f"out-{time.monotonic_ns()}"
    code.mkdir(exist_ok=True)
    out.mkdir()
    shutil.copy(TRAINER, code / "train.py")
    (code / "mode").write_text("ok\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if freeze:
        env["BENCH_FREEZE_AT_EXIT"] = "1"
    p = subprocess.Popen(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "train.py", str(out), "40"],
        cwd=code, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        progress = out / "progress.jsonl"
        deadline = time.monotonic() + 60
        while not progress.exists() or len(progress.read_text().splitlines()) < 20:
            if time.monotonic() > deadline:
                raise SystemExit("the trainer did not train within 60 s")
            time.sleep(0.1)
        kids = [int(k) for k in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
        fds = {os.pidfd_open(k): k for k in kids}  # held before the signal: no pid reuse
        t0 = time.monotonic()
        for fd in fds:
            signal.pidfd_send_signal(fd, signal.SIGTERM)
        left = set(fds)
        while left:
            ready, _, _ = select.select(list(left), [], [], 30)
            if not ready:
                raise SystemExit("a rank did not exit within 30 s of SIGTERM")
            left -= set(ready)
        ranks = time.monotonic() - t0
        p.wait(timeout=30)
        return ranks, time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # our own torchrun's session (setsid above)
            p.wait()


def main() -> None:
    rounds = int(sys.argv[1]) if sys.argv[1:] else 3
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench-exit-") as d:
        for _ in range(rounds):
            for freeze in (False, True):
                got[freeze].append(one(Path(d), freeze))
    for freeze, label in ((False, "as written"), (True, "gc.freeze() after the save")):
        ranks = statistics.median(r for r, _ in got[freeze])
        whole = statistics.median(w for _, w in got[freeze])
        print(f"{label:<28} ranks gone {ranks:.2f} s, torchrun gone {whole:.2f} s", end="")
        print(f" (median of {rounds})")
    a = statistics.median(r for r, _ in got[False])
    b = statistics.median(r for r, _ in got[True])
    print(f"ranks' exit: {b / a:.2f}x with gc.freeze()")


if __name__ == "__main__":
    main()
