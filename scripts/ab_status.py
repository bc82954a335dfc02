"""`trainctl status` of two checkouts side by side, interleaved (an A/B of a change).

Usage: python scripts/ab_status.py OLD_CHECKOUT NEW_CHECKOUT

Each checkout needs its own venv (``bash scripts/_venv.sh`` inside it). For each, a
`sleep 600` job is started in a temporary home of its own; `status` is timed in turns
through its first 1.5 s (the supervisor is busy with its first looks) and then 20 times
each once it settled. Prints the medians; stops both jobs (their own homes, by trainctl).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    clones = {"old": Path(sys.argv[1]), "new": Path(sys.argv[2])}
    top = Path(tempfile.mkdtemp(prefix="trainctl-ab-"))
    envs = {k: {**os.environ, "TRAINCTL_HOME": str(top / k)} for k in clones}

    def tc(k: str, *args: str) -> float:
        t = time.perf_counter()
        subprocess.run(
            [str(clones[k] / ".venv" / "bin" / "trainctl"), *args],
            env=envs[k],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return (time.perf_counter() - t) * 1000

    try:
        for k in clones:
            tc(k, "start", "--name", "j", "--", "sleep", "600")
        fresh: dict[str, list[float]] = {k: [] for k in clones}
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            for k in clones:
                fresh[k].append(tc(k, "status", "j"))
        time.sleep(5)
        settled: dict[str, list[float]] = {k: [] for k in clones}
        for _ in range(20):
            for k in clones:
                settled[k].append(tc(k, "status", "j"))
        for k, where in clones.items():
            print(
                f"{k} ({where}): status just after start {statistics.median(fresh[k]):.1f} ms "
                f"(n={len(fresh[k])}), settled {statistics.median(settled[k]):.1f} ms (n=20)"
            )
    finally:
        for k in clones:
            tc(k, "stop", "--all", "--yes")
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
