"""A plain stop never tears a checkpoint that is being saved in place.

Found on a real H200 (scripts/gpu_smoke_train.sh, 2026-12-04): a trainer of nanoGPT's
shape (no signal handler, `torch.save` over the same `ckpt.pt` every 50 steps) was
stopped by a plain `trainctl stop` while it wrote: the SIGTERM killed it mid-save, the
file was left without its zip end record, and `restart` then failed to load it: the stop
had destroyed the run's only resume point, not just the steps since the last save.

A stop now looks at the newest checkpoint before its first signal: while it is being
written (incomplete, touched in the last 2 s) the stop waits for the save to end, at
most the grace (and a minute), and says so.
"""

from __future__ import annotations

import sys
import time
import zipfile
from pathlib import Path

from tests.conftest import Harness, wait_for
from trainctl.supervisor.model import checkpoints

# a zip of ~1 MiB written in place over ~1.6 s (truncated first, the end record last:
# torch.save's shape), then 2 s of training, again and again; no signal handler
WRITER = r"""
import io, os, sys, time, zipfile
path = sys.argv[1]
while True:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data.pkl", os.urandom(1 << 20))
    data = buf.getvalue()
    with open(path, "wb") as f:
        for i in range(0, len(data), 1 << 16):
            f.write(data[i : i + (1 << 16)])
            f.flush()
            time.sleep(0.1)
    time.sleep(2)
"""


def _writing(path: Path) -> bool:
    v = checkpoints.judge(str(path), look_again=False)
    return v is not None and not v.complete and time.time() - v.mtime < 1.0


def _whole(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


def _start(h: Harness, name: str, ck: Path, grace: str) -> None:
    h.tc(
        "start", "--name", name, "--grace", grace, "--set", f"checkpoint={ck}",
        "--", sys.executable, "-c", WRITER, str(ck),
        check=True,
    )  # fmt: skip
    wait_for(lambda: _whole(ck), 30, "the first complete save")


def test_a_stop_during_a_save_waits_for_it_and_leaves_the_checkpoint_whole(
    harness: Harness,
) -> None:
    h = harness
    ck = h.tmp / "ckpt.pt"
    _start(h, "w", ck, "10")
    wait_for(lambda: _writing(ck) and ck.stat().st_size < 400_000, 30, "a save begun")
    doc = h.tc("stop", "w", "--json", check=True).json()
    rep = doc["report"]
    assert rep["ok"] is True
    assert _whole(ck), "the stop tore the checkpoint"
    assert 0 < rep["save_waited_s"] < 5, rep["save_waited_s"]
    events = (h.home / "jobs" / "w" / "events.jsonl").read_text()
    assert '"event": "save_awaited"' in events
    text = h.tc("status", "w").out
    assert "complete" in text or "newest" in text or "ckpt" in text


def test_a_stop_with_no_save_under_way_does_not_wait(harness: Harness) -> None:
    h = harness
    ck = h.tmp / "ckpt.pt"
    _start(h, "q", ck, "10")
    wait_for(lambda: not _writing(ck) and _whole(ck), 30, "a quiet moment between saves")
    t0 = time.monotonic()
    rep = h.tc("stop", "q", "--json", check=True).json()["report"]
    assert rep["save_waited_s"] is None
    assert time.monotonic() - t0 < 5


def test_the_wait_is_bounded_by_the_grace(harness: Harness) -> None:
    h = harness
    ck = h.tmp / "ckpt.pt"
    _start(h, "g", ck, "0.3")
    wait_for(lambda: _writing(ck) and ck.stat().st_size < 400_000, 30, "a save begun")
    rep = h.tc("stop", "g", "--json", check=True).json()["report"]
    assert rep["save_waited_s"] is not None
    assert rep["save_waited_s"] <= 1.0, rep["save_waited_s"]  # the grace, not the save
