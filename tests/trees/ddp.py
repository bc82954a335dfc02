"""DDP-like: main spawns 2 ranks (multiprocessing spawn), each forks 2 dataloader workers.

Ranks ignore SIGINT like torch elastic workers that leave shutdown to their launcher; the
main forwards SIGTERM to ranks and waits for them.
"""

import multiprocessing as mp
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_flag, forever, ready, wait_files  # noqa: E402


def loader(flag: str) -> None:
    open(flag, "w").close()
    forever()


def rank(r: int, flags: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=loader, args=(flags[i],), daemon=False) for i in range(2)]
    for w in workers:
        w.start()
    open(child_flag(f"rank{r}"), "w").close()
    while True:
        time.sleep(0.1)


def main() -> None:
    ctx = mp.get_context("spawn")
    flags = [[child_flag(f"r{r}w{i}") for i in range(2)] for r in range(2)]
    ranks = [ctx.Process(target=rank, args=(r, flags[r])) for r in range(2)]
    for p in ranks:
        p.start()
    wait_files([f for fl in flags for f in fl] + [child_flag(f"rank{r}") for r in range(2)], 60)
    ready()

    def on_term(_s: int, _f: object) -> None:
        for p in ranks:
            p.terminate()
        for p in ranks:
            p.join(5)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
