"""The samples the supervisor records for the charts (issue 37 §1): unit tests of the
downsampling, and a real run's samples (CPU, memory, members, GPU, progress)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import Harness, wait_for
from tests.gpu.test_gpus import fake_gpus
from trainctl.supervisor.watch import samples
from trainctl.supervisor.watch.samples import Sample, SampleLog, merge, read_series, samples_path


def test_merge_means_levels_keeps_memory_peaks_and_the_newest_progress() -> None:
    a = Sample(t=1, cpu_pct=10, mem_bytes=100, members=2, gpu_mem={"0": 5}, gpu_util={"0": 10})
    b = Sample(t=2, cpu_pct=30, mem_bytes=300, members=3, gpu_mem={"0": 9}, gpu_util={"0": 30})
    c = Sample(t=3, cpu_pct=None, mem_bytes=200, members=1, progress={"step": 7, "loss": 0.5})
    m = merge([a, b, c])
    assert m.t == 3
    assert m.cpu_pct == 20  # the mean of what was measured
    assert m.mem_bytes == 300  # a peak a mean would hide
    assert m.members == 3
    assert m.gpu_mem == {"0": 9}
    assert m.gpu_util == {"0": 20}
    assert m.progress == {"step": 7, "loss": 0.5}


def test_a_week_of_samples_stays_small_and_reads_back_in_order(tmp_path: Path) -> None:
    log = tmp_path / "run-1.log"
    book = SampleLog(log)
    week = 7 * 24 * 360  # a sample every 10 s
    for i in range(week):
        t = 1_000_000.0 + 10 * i
        book.append(
            Sample(t=t, cpu_pct=50.0, mem_bytes=2 << 30, members=9, gpu_mem={str(g): 40 << 30
            for g in range(8)}, gpu_util={str(g): 97 for g in range(8)},
            progress={"step": float(i), "loss": 1.0 / (1 + i)})
        )  # fmt: skip
    fine = samples_path(log).read_bytes().count(b"\n")
    coarse = samples_path(log, coarse=True).read_bytes().count(b"\n")
    assert samples.FINE_KEEP <= fine <= samples.FINE_MAX
    assert coarse == week // samples.COARSE_EVERY
    size = samples_path(log).stat().st_size + samples_path(log, coarse=True).stat().st_size
    assert size < 3 << 20, size  # "a few MB" at most, for 8 GPUs
    series = read_series(log)
    times = [s.t for s in series]
    assert times == sorted(times)
    assert series[0].t < 1_000_000.0 + 3600  # the whole week is there, coarsely
    assert series[-1].progress["step"] == week - 1  # and the newest sample, finely
    assert len(series) < coarse + fine


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "run-1.log"
    samples_path(log).write_text('{"t": 1, "n": 2}\nnot json\n[1]\n{"t": 2, "cpu": "x"}\n{"t": 3')
    got = read_series(log)
    assert [s.t for s in got] == [1.0, 2.0]
    assert got[1].cpu_pct is None


# writes progress (step and loss) and spins a little, on GPU 0 (the fake backend)
BUSY = """
import json, os, time
p = os.environ["TRAINCTL_PROGRESS"]
step = 0
while True:
    step += 1
    end = time.time() + 0.02
    while time.time() < end:
        pass
    with open(p, "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
    time.sleep(0.03)
"""


def test_a_real_run_is_sampled(harness: Harness) -> None:
    h = harness
    fake_gpus(h, n=1)
    (h.tmp / "config.toml").write_text('[supervisor]\nsample_interval = "0.2s"\n')
    h.tc("start", "--name", "busy", "--gpus", "0", "--", sys.executable, "-c", BUSY, check=True)
    log = h.home / "jobs" / "busy" / "logs" / "run-1.log"
    wait_for(lambda: len(read_series(log)) >= 6, 30, "six samples")
    series = read_series(log)
    assert all(s.members >= 1 for s in series)
    assert all(s.mem_bytes and s.mem_bytes > 1 << 20 for s in series)  # a python's RSS
    assert any(s.cpu_pct and s.cpu_pct > 1 for s in series)  # it spins 40 % of its time
    assert all(s.gpu_mem.get("0", 0) > 0 for s in series)  # the leased GPU's memory
    steps = [s.progress["step"] for s in series if "step" in s.progress]
    assert steps == sorted(steps)
    assert steps[-1] > steps[0]
    assert "loss" in series[-1].progress
    assert h.tc("stop", "busy").rc == 0
    first = json.loads(samples_path(log).read_text().splitlines()[0])
    assert set(first) >= {"t", "n", "mem", "gmem", "p"}
