"""The Slurm backend on two nodes: a real cluster in Slurm's multiple-slurmd mode.

Two slurmd (`slurmd -N n1`, `-N n2`) on this host, each its own node to slurmctld, with
private ports and a private munge: what a login node and two compute nodes see, on one
machine. Every job here spans both nodes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TREES, Harness, kill_verified, wait_for
from tests.helpers import free_port
from tests.slurm.test_slurm import cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    host = socket.gethostname().split(".")[0]
    cpus = max(1, (os.cpu_count() or 2) // 2)
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus}"
        for n in NODES
    )
    yield from cluster(tmp_path_factory, "trainctltest2", node_lines, NODES)


@pytest.fixture
def sl2(harness: Harness, two_nodes: Path) -> Harness:
    harness.env["SLURM_CONF"] = str(two_nodes)
    return harness


def _start2(h: Harness, name: str, *args: str) -> None:
    """Start job ``name`` on both nodes; ``args``: more start options, ``--``, the argv."""
    h.tc("start", "--name", name, "--backend", "slurm", "--nodes", "2", *args, check=True)


def _status(h: Harness, name: str) -> dict:  # type: ignore[type-arg]
    doc = h.tc("status", name, "--json").json()
    assert isinstance(doc, dict)
    return doc


def test_each_node_gets_its_rank_and_the_rendezvous_and_is_seen_and_stopped(sl2: Harness) -> None:
    h = sl2
    report = (
        "echo node=$SLURMD_NODENAME rank=$NODE_RANK nnodes=$NNODES procid=$SLURM_PROCID "
        "master=$MASTER_ADDR:$MASTER_PORT job=$SLURM_JOB_ID; exec sleep 600"
    )
    _start2(h, "env", "--", "sh", "-c", report)
    logs = h.home / "jobs" / "env" / "logs"
    first, second = logs / "run-1.log", logs / "run-1.n2.log"
    wait_for(
        lambda: (
            "node=" in (first.read_text() if first.exists() else "")
            and second.exists()
            and "node=" in second.read_text()
        ),
        60,
        "both nodes' output",
    )
    lines = {}
    for path in (first, second):
        line = next(ln for ln in path.read_text().splitlines() if ln.startswith("node="))
        lines[path.name] = dict(kv.split("=", 1) for kv in line.split())
    a, b = lines["run-1.log"], lines["run-1.n2.log"]
    assert (a["node"], a["rank"], b["node"], b["rank"]) == ("n1", "0", "n2", "1")
    assert a["nnodes"] == b["nnodes"] == "2"
    assert a["master"] == b["master"] != ":"
    assert a["master"].split(":")[0] == socket.gethostname()
    assert a["job"] == b["job"] != ""
    # the view from anywhere: both agents publish their members
    wait_for(
        lambda: (
            len(_status(h, "env")["slurm"]["agents"]) == 2 and _status(h, "env")["members"] >= 2
        ),
        20,
        "both agents' members",
    )
    human = h.tc("status", "env").out
    assert "node n1" in human
    assert "node n2" in human
    ps = h.tc("ps", "env").out
    assert "NODE" in ps
    assert "n1" in ps
    assert "n2" in ps
    plain = h.tc("logs", "env")  # the first node's log, and where the others' are
    assert "node=n1" in plain.out
    assert "node n1's log" in plain.err
    assert "trainctl logs env --node n2" in plain.err
    node_log = h.tc("logs", "env", "--node", "n2")
    assert node_log.err == ""
    assert "node=n2" in node_log.out
    assert h.tc("logs", "env", "--node", "n9").rc == 2
    stop = h.tc("stop", "env", "--json")
    assert stop.rc == 0, stop
    doc = stop.json()
    assert isinstance(doc, dict)
    nodes = {n["node"]: n for n in doc["report"]["nodes"]}
    assert set(nodes) == {"n1", "n2"}
    assert all(n["ok"] and n["by"] == "its agent" for n in nodes.values()), nodes
    assert doc["report"]["unverified"] == []
    assert not h.job_pids("env")
    # Slurm's own final word is kept: status does not ask Slurm again about an ended run
    assert _status(h, "env")["slurm"]["state"] == doc["report"]["slurm"]["state"]


def test_a_real_two_node_torchrun_checkpoints_on_a_plain_stop(sl2: Harness) -> None:
    pytest.importorskip("torch", reason="no CPU build of torch here (pip install torch==2.13.0)")
    h = sl2
    out = h.tmp / "ckpt"
    out.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = (
        f"exec {torchrun} --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node 1 "
        "--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT "
        f"{TREES / 'torch_train.py'} {out}"
    )
    _start2(h, "ddp", "--grace", "60", "--env", "OMP_NUM_THREADS=1", "--", "sh", "-c", cmd)
    ready = [out / f"rank{r}.ready" for r in range(2)]
    wait_for(lambda: all(p.exists() for p in ready), 100, "both ranks to train")
    stop = h.tc("stop", "ddp", "--json", timeout=120)
    logs = (h.tc("logs", "ddp").out, h.tc("logs", "ddp", "--node", "n2").out)
    assert stop.rc == 0, (stop, logs)
    assert sorted(p.name for p in out.glob("rank*.pt")) == ["rank0.pt", "rank1.pt"]
    assert not h.job_pids("ddp")


def test_a_node_that_stops_first_waits_for_the_others_graceful_stop(sl2: Harness) -> None:
    """n1's job ends at once on SIGTERM; n2's rank needs its loaders 3 s to checkpoint.
    srun --kill-on-bad-exit would end the step as soon as n1's agent exits non-zero,
    killing n2's loaders under its rank: every agent waits for the others' stops first."""
    h = sl2
    loader = f"{sys.executable} {TREES / 'loader_ranks.py'} {h.tmp} --finish 3"
    cmd = f'if [ "$NODE_RANK" = 1 ]; then exec {loader}; else exec sleep 600; fi'
    ready = h.tmp / "n2.ready"
    _start2(h, "bar", "--grace", "30", "--env", f"TREE_READY={ready}", "--", "sh", "-c", cmd)
    wait_for(ready.exists, 90, "n2's rank and its loaders")
    stop = h.tc("stop", "bar", "--json", timeout=120)
    assert stop.rc == 0, stop
    assert (h.tmp / "rank0.ckpt").exists(), h.tc("logs", "bar", "--node", "n2").out
    assert not (h.tmp / "rank0.crash").exists()
    assert not h.job_pids("bar")


def test_agents_publish_a_change_of_their_members_within_a_second(sl2: Harness) -> None:
    h = sl2
    ready = h.tmp / "grown.ready"
    grow = f"sleep 3; sleep 600 & sleep 600 & sleep 600 & touch {ready}.$NODE_RANK; wait"
    _start2(h, "grow", "--", "sh", "-c", grow)
    records = [h.home / "jobs" / "grow" / "slurm" / f"run-1.{n}.json" for n in NODES]
    for rank, rec in enumerate(records):
        wait_for(Path(f"{ready}.{rank}").exists, 60, f"rank {rank}'s helpers")
        seen_at = time.monotonic()
        wait_for(lambda r=rec: json.loads(r.read_text())["member_count"] >= 4, 10, "published")
        lag = time.monotonic() - seen_at
        assert lag < 1.5, f"{rec.name}: members published {lag:.2f} s after the change"
    assert _status(h, "grow")["members"] >= 8
    assert h.tc("stop", "grow").rc == 0
    assert not h.job_pids("grow")


def test_a_node_whose_agent_left_no_report_gets_a_sweep_job(sl2: Harness) -> None:
    """Slurm ended the job, but one node's agent died without reporting, and a process of
    the job outlived it: `stop` runs a sweep job on that node, which finds and stops it."""
    h = sl2
    _start2(h, "sw", "--", "true")
    wait_for(lambda: h.tc("status", "sw").rc == 3, 60, "the job to end")
    jdir = h.home / "jobs" / "sw"
    record = jdir / "slurm" / "run-1.n2.json"
    wait_for(record.exists, 10, "n2's record")
    doc = json.loads(record.read_text())
    doc["stop"] = None  # as if n2's agent had been SIGKILLed before its report
    record.write_text(json.dumps(doc))
    marker = json.loads((jdir / "state.json").read_text())["marker"]
    leftover = subprocess.Popen(  # ours: it carries the test's mark and the job's marker
        ["sleep", "600"], env={**h.env, "TRAINCTL_JOB": marker}, start_new_session=True
    )
    wait_for(lambda: bool(h.job_pids("sw")), 10, "the leftover to be seen")
    stop = h.tc("stop", "sw", "--json", timeout=120)
    assert stop.rc == 0, stop
    report = stop.json()["report"]  # type: ignore[index]
    assert report["sweep_jobs"] == ["n2"]
    n2 = next(n for n in report["nodes"] if n["node"] == "n2")
    assert n2["by"] == "a sweep job"
    assert n2["found"] == 1  # the sweep job, not this host's own sweep, found it
    assert leftover.wait(10) is not None
    assert not h.job_pids("sw")
    assert "nothing to stop" in h.tc("stop", "sw").out
    # the sweep's report joined n2's record: n2 is still rank 1, its log still its own
    agents = {a["node"]: a for a in _status(h, "sw")["slurm"]["agents"]}
    assert agents["n2"]["rank"] == "1"
    assert h.tc("logs", "sw", "--node", "n2").rc == 0


def test_both_agents_sigkilled_then_stop_leaves_nothing(sl2: Harness) -> None:
    h = sl2
    _start2(h, "k", "--", "sh", "-c", "setsid sleep 600 & exec sleep 600")
    jdir = h.home / "jobs" / "k"
    records = [jdir / "slurm" / f"run-1.{n}.json" for n in NODES]
    wait_for(lambda: all(r.exists() for r in records), 60, "both agents")
    wait_for(lambda: len(h.job_pids("k")) >= 4, 30, "both nodes' processes")
    marker = json.loads((jdir / "state.json").read_text())["marker"]
    for r in records:
        pid = int(json.loads(r.read_text())["agent"])
        start, is_ours = _ours(h, pid, marker)
        assert is_ours  # started by this test (its mark), and the agent of this job
        kill_verified(pid, start)
    # status counts what the killed agents left, by the marker on this host, not 0
    wait_for(lambda: _status(h, "k")["members"] >= 2, 30, "the leftovers counted")
    stop = h.tc("stop", "k", "--json", timeout=150)
    assert stop.rc == 0, stop
    assert not h.job_pids("k")
    report = stop.json()["report"]  # type: ignore[index]
    assert all(n["ok"] for n in report["nodes"]), report["nodes"]


def _ours(h: Harness, pid: int, marker: str) -> tuple[int, bool]:
    start = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    ours = f"TCTEST_MARK={h.mark}".encode() in env and marker.encode() in argv
    return start, ours
