"""Self-healing on a GPU fault (issue 47 §3): a run whose GPU falls off the bus goes on,
at once, on the healthy GPUs left when ``min_gpus`` allows, from its newest complete
checkpoint, with CUDA_VISIBLE_DEVICES and $TRAINCTL_GPU_COUNT following; a second fault
that leaves too few ends it, and `restart` grows it back once the GPU is healthy again.

The driver is the C double of libnvidia-ml.so.1 (the real nvidia-ml-py loads it); the job
is a trainer that keeps the device node of every GPU it is given open, as CUDA does, saves
every 10 steps and resumes from $TRAINCTL_RESUME_FROM.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from tests.gpu.test_nvml_double import driver, watched

pytest.importorskip("pynvml")

TRAINER = """\
import json, os, sys, time
ck, out = sys.argv[1], sys.argv[2]
cvd = os.environ["CUDA_VISIBLE_DEVICES"]
nodes = [os.open(f"{os.environ['FAKE_DEV_DIR']}/nvidia{i}", os.O_RDWR) for i in cvd.split(",")]
resume = os.environ.get("TRAINCTL_RESUME_FROM")
step = int(open(resume).read()) if resume else 0
run = os.environ["TRAINCTL_RUN"]
with open(os.path.join(out, f"run{run}.json"), "w") as f:
    json.dump({"cvd": cvd, "count": os.environ.get("TRAINCTL_GPU_COUNT"), "resume": resume,
               "first": step + 1}, f)
os.makedirs(ck, exist_ok=True)
while True:
    step += 1
    time.sleep(0.03)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % 10 == 0:
        tmp = os.path.join(ck, f".step_{step:06d}.tmp")
        with open(tmp, "w") as f:
            f.write(str(step))
        os.replace(tmp, os.path.join(ck, f"step_{step:06d}.txt"))
"""


def start_trainer(h: Harness, name: str, *extra: str) -> tuple[Path, Path]:
    ck, out = h.tmp / f"{name}-ck", h.tmp / f"{name}-out"
    out.mkdir()
    h.tc(
        "start", "--name", name, "--gpus", "0,1,2,3", "--grace", "2",
        "--set", f"checkpoint={ck}/step_*", *extra,
        "--", sys.executable, "-c", TRAINER, str(ck), str(out),
        check=True,
    )  # fmt: skip
    watched(h, name)
    wait_for((ck / "step_000020.txt").exists, 30, "two saves")
    return ck, out


def test_xid_79_with_min_gpus_goes_on_on_the_healthy_three(harness: Harness) -> None:
    h = harness
    d = driver(h, 4)
    _, out = start_trainer(h, "heal", "--min-gpus", "3")
    d.device(2, xids=[79])
    wait_for((out / "run2.json").exists, 30, "run 2 on the healthy GPUs")
    run2 = json.loads((out / "run2.json").read_text())
    assert run2["cvd"] == "0,1,3"
    assert run2["count"] == "3"
    assert run2["resume"] is not None
    saved = int(Path(run2["resume"]).read_text())
    assert saved >= 20
    assert run2["first"] == saved + 1  # from the newest complete checkpoint, not step 1
    run1 = json.loads((out / "run1.json").read_text())
    assert (run1["cvd"], run1["count"]) == ("0,1,2,3", "4")
    st = h.state("heal")
    assert st["run"] == 2
    assert [g["index"] for g in st["gpus"]] == [0, 1, 3]
    [entry] = st["restart_history"]
    assert entry["kind"] == "gpu", entry
    assert entry["cause"].startswith("GPU 2 lost (Xid 79: reboot needed); restarting on 3 of 4")
    status = h.tc("status", "heal").out
    assert re.search(r"running on 3 of 4 GPUs \(GPU 2 unhealthy since \d\d:\d\d\)", status)
    doc = h.tc("status", "heal", "--json").json()
    assert doc["gpus_note"].startswith("running on 3 of 4 GPUs")  # type: ignore[index]
    assert re.search(r"GPU 2  UNHEALTHY: Xid 79", h.tc("gpus").out)
    # `report` puts what the fault cost in its own bucket: the hardware's, not the code's
    report = h.tc("report", "heal", "--json", check=True).json()
    assert report["lost_s"]["gpu_faults"] > 0, report  # type: ignore[index]
    assert report["lost_s"]["down"] == 0, report  # type: ignore[index]
    assert report["lost_s"]["steps_redone"] == 0, report  # type: ignore[index]
    [cut] = report["interruptions"]  # type: ignore[index]  # run 2 runs: not one
    assert cut["cause"].startswith("GPU 2 lost (Xid 79: reboot needed)")
    assert "gpu faults" in h.tc("report", "heal").out
    # no breaker counts a GPU fault: restart_on and max_restarts were never set
    # GPU 2 is healthy again (after a reset): `restart` grows the run back to 4
    assert h.tc("gpus", "--clear", "2", check=True).rc == 0
    d.device(2, xids=[])
    assert "GPU 2 left out, healthy now: `trainctl restart heal` grows" in (
        h.tc("status", "heal").out
    )
    h.tc("restart", "heal", check=True)
    wait_for((out / "run3.json").exists, 30, "run 3 on all four")
    run3 = json.loads((out / "run3.json").read_text())
    assert (run3["cvd"], run3["count"]) == ("0,1,2,3", "4")
    assert run3["first"] > saved  # the restart resumed too
    assert "GPUs running on" not in h.tc("status", "heal").out
    h.tc("stop", "heal", check=True)


def test_a_second_fault_that_leaves_too_few_ends_the_run_and_nothing_loops(
    harness: Harness,
) -> None:
    h = harness
    d = driver(h, 4)
    _, out = start_trainer(h, "two", "--min-gpus", "3")
    d.device(2, xids=[79])
    wait_for((out / "run2.json").exists, 30, "run 2 on the healthy GPUs")
    events = h.home / "jobs" / "two" / "events.jsonl"
    wait_for(lambda: events.read_text().count('"event": "gpu_watch"') >= 2, 20, "run 2's watch")
    d.device(1, xids=[79])
    wait_for(lambda: h.state("two")["phase"] == "failed", 30, "the run to end")
    st = h.state("two")
    assert st["run"] == 2  # no run 3: two healthy GPUs are fewer than min_gpus
    assert st["cause"]["kind"] == "too-few-gpus", st["cause"]
    assert st["cause"]["summary"].startswith("2 healthy GPU(s) left, fewer than min_gpus 3")
    assert "GPU 1 lost (Xid 79" in st["cause"]["summary"]
    assert not h.job_pids("two")


def test_without_min_gpus_the_cause_says_how_to_go_on(harness: Harness) -> None:
    h = harness
    d = driver(h, 4)
    _, out = start_trainer(h, "plain")
    d.device(3, xids=[79])
    wait_for(lambda: h.state("plain")["phase"] == "failed", 30, "the run to end")
    cause = h.state("plain")["cause"]
    assert cause["kind"] == "gpu"
    assert (
        "trainctl start plain --gpus 0,1,2, (a process count of $TRAINCTL_GPU_COUNT"
        in (cause["summary"])
    )
    assert not (out / "run2.json").exists()
    # an explicit restart is refused while GPU 3 is unhealthy (never started onto it)
    res = h.tc("restart", "plain")
    assert res.rc == 1, res
    assert "GPU 3 is unhealthy: Xid 79" in res.err
    # the queue counts GPU 3 as absent: a job that needs all four waits, saying why ...
    q = h.tc("start", "--name", "q", "--queue", "--gpus", "4", "--", "sleep", "600")
    assert q.rc == 0, q
    wait_for(lambda: "GPU 3 unhealthy: Xid 79" in h.tc("status", "q").out, 20, "the reason")
    assert "needs 4 GPU(s), 3 free" in h.tc("status", "q").out
    # ... and starts once the GPU is healthy again
    d.device(3, xids=[])
    h.tc("gpus", "--clear", "3", check=True)
    started = h.home / "jobs" / "q" / "state.json"
    wait_for(lambda: started.exists() and h.state("q")["phase"] == "running", 30, "q to start")
    assert [g["index"] for g in h.state("q")["gpus"]] == [0, 1, 2, 3]
    h.tc("stop", "q", check=True)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", "min_gpus must be at least 1"),
        ("5", "min_gpus 5 is more than the 4 GPU(s) asked"),
        ("x", "'x' is not a valid integer"),
    ],
)
def test_bad_min_gpus_is_one_line_and_exit_2(harness: Harness, value: str, needle: str) -> None:
    h = harness
    driver(h, 4)
    res = h.tc("start", "--name", "b", "--gpus", "0,1,2,3", "--min-gpus", value, "--", "true")
    assert res.rc == 2, res
    assert needle in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert not (h.home / "jobs" / "b").exists()


@pytest.mark.slow
def test_real_torchrun_goes_on_with_one_rank_per_healthy_gpu(harness: Harness) -> None:
    """The same on real torchrun (CPU, gloo): one rank per GPU, the process count taken
    from $TRAINCTL_GPU_COUNT; after an Xid 79 on GPU 1 of 3 with min_gpus = 2, run 2 has
    two ranks on GPUs 0 and 2, resumed from the checkpoint the ranks saved in their grace."""
    pytest.importorskip("torch")
    h = harness
    d = driver(h, 3)
    ck, out = h.tmp / "ck", h.tmp / "out"
    out.mkdir()
    ranks = Path(__file__).parents[1] / "trees" / "torch_gpu_ranks.py"
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = f"exec {torchrun} --standalone --nproc-per-node=$TRAINCTL_GPU_COUNT {ranks} {ck} {out}"
    h.tc(
        "start", "--name", "tr", "--gpus", "0,1,2", "--min-gpus", "2", "--grace", "20",
        "--set", f"checkpoint={ck}/step_*.pt", "--env", "OMP_NUM_THREADS=1",
        "--", "sh", "-c", cmd,
        check=True,
    )  # fmt: skip
    watched(h, "tr", 30)
    wait_for((ck / "step_000020.pt.complete").exists, 120, "a first complete save")
    run1 = [json.loads((out / f"run1-rank{r}.json").read_text()) for r in range(3)]
    assert [(x["world"], x["gpu"]) for x in run1] == [(3, "0"), (3, "1"), (3, "2")]
    d.device(1, xids=[79])
    wait_for(lambda: len(list(out.glob("run2-rank*.json"))) == 2, 120, "run 2's two ranks")
    time.sleep(0.2)
    run2 = [json.loads((out / f"run2-rank{r}.json").read_text()) for r in range(2)]
    assert [(x["world"], x["gpu"]) for x in run2] == [(2, "0"), (2, "2")]
    resumed = int(Path(run2[0]["resume"]).name.removeprefix("step_").removesuffix(".pt"))
    assert resumed >= 20
    assert run2[0]["first"] == resumed + 1
    assert not (out / "run2-rank2.json").exists()
    status = h.tc("status", "tr").out
    assert re.search(r"running on 2 of 3 GPUs \(GPU 1 unhealthy since \d\d:\d\d\)", status)
    h.tc("stop", "tr", check=True)
