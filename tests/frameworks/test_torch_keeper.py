"""The run keeper on real torchrun jobs (CPU, gloo, 2 ranks): a failing rank's cause, and
where each rank of a stalled DDP run is stuck."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import TREES, Harness, kill_verified, wait_for
from tests.helpers import NEEDS_TORCH, free_port, stop_and_check

pytestmark = NEEDS_TORCH

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
KEEPER = str(TREES / "torch_keeper.py")


def _start(h: Harness, name: str, mode: str, *more: str) -> Path:
    out = h.tmp / f"out-{name}"
    out.mkdir()
    h.tc(
        "start", "--name", name, "--cwd", str(h.tmp), "--env", "OMP_NUM_THREADS=1",
        *more, "--", TORCHRUN, "--standalone", "--nproc-per-node", "2",
        f"--master-port={free_port()}", KEEPER, mode, str(out),
        check=True,
    )  # fmt: skip
    wait_for(lambda: all((out / f"rank{r}.ready").exists() for r in range(2)), 90, f"{mode} ranks")
    return out


def test_the_cause_names_the_failing_rank_and_its_exception(harness: Harness) -> None:
    h = harness
    _start(h, "tr", "raise")
    res = h.tc("wait", "tr", "--json", timeout=120)
    assert res.rc == 1
    doc = res.json()
    assert isinstance(doc, dict)
    cause = doc["cause"]
    assert cause["kind"] == "exit"
    assert cause["reason"] == "ValueError: bad batch at step 7 on rank 1"
    assert cause["rank"] == 1
    assert cause["source"] == "torchelastic"
    assert cause["at"] > 0
    assert "(rank 1)" in cause["summary"]
    error_file = h.home / "jobs" / "tr" / "logs" / "run-1.error.json"
    assert json.loads(error_file.read_text())["message"]["message"].startswith("ValueError")


def test_a_stalled_ddp_run_shows_each_rank_and_keeps_its_stacks_before_kill(
    harness: Harness,
) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.5\n")
    _start(h, "ddp", "stall", "--set", "stall_timeout=3", "--grace", "1")
    stall_file = h.home / "jobs" / "ddp" / "stacks" / "run-1.stall.json"
    wait_for(stall_file.exists, 60, "the stall stacks")
    # the stacks are written as the stall is found; the state that says so follows them.
    # A rank's late "ready" line can end a first stall (then the next one is the same
    # stall again): read STALLED and the stacks' path from one status.
    seen = [""]

    def stalled() -> bool:
        seen[0] = h.tc("status", "ddp").out
        return "STALLED" in seen[0] and str(stall_file) in seen[0]

    wait_for(stalled, 30, "status to say STALLED with its stacks")
    status = seen[0]
    assert str(stall_file) in status
    doc = h.tc("stack", "ddp", "--json", check=True, timeout=60).json()
    assert isinstance(doc, dict)
    where = {}
    for g in doc["groups"]:
        names = [f["name"] for f in g["frames"]]
        for t in g["threads"]:
            if t["rank"] is not None:
                where.setdefault(t["rank"], []).append(names)
    assert any("rank_one_sleeps" in n for n in where["1"]), where["1"]
    assert any("rank_zero_waits" in n and "all_reduce" in n for n in where["0"]), where["0"]
    doc = h.tc("stop", "ddp", "--json", check=True, timeout=90).json()
    assert isinstance(doc, dict)
    report = doc["report"]
    assert report["killed"] >= 2  # both ranks ignore SIGTERM: the grace ran out
    kept = json.loads(Path(report["stacks"]).read_text())
    functions = {
        f["name"] for p in kept["processes"] for t in p["threads"] for f in t.get("frames", [])
    }
    assert {"rank_one_sleeps", "rank_zero_waits"} <= functions


def test_torchruns_own_restart_of_a_killed_rank_trains_again_in_signals_mode(
    harness: Harness,
) -> None:
    """`torchrun --max-restarts 1`, one rank SIGKILLed, in signals mode with a supervisor
    that ticks fast: the new round's ranks must reach each other and train, then both
    checkpoint on a plain stop. Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE, which trainctl
    sets, most new rounds died in "gloo ... Connection refused" (pytorch/pytorch#135712)."""
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text(
        "[start]\ncgroup = false\n[supervisor]\nsnapshot_interval_s = 0.1\n"
    )
    out = h.tmp / "out"
    out.mkdir()
    h.tc(
        "start", "--name", "mr", "--cwd", str(h.tmp), "--grace", "40",
        "--env", "OMP_NUM_THREADS=1", "--", TORCHRUN, "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "1", str(TREES / "torch_train.py"), str(out),
        check=True,
    )  # fmt: skip
    ready = [out / f"rank{r}.ready" for r in range(2)]
    wait_for(lambda: all(p.exists() for p in ready), 90, "both ranks to train")
    for p in ready:
        p.unlink()
    rows = h.tc("ps", "mr", "--json", check=True).json()
    assert isinstance(rows, list)
    main = h.state("mr")["main"]["pid"]
    rank = next(r for r in rows if r["ppid"] == main)
    victim = int(rank["pid"])
    assert victim in h.job_pids("mr")  # ours: started by this test, of this job
    kill_verified(victim, h.job_pids("mr")[victim])
    wait_for(lambda: all(p.exists() for p in ready), 90, "the restarted round to train")
    log = h.tc("logs", "mr", "-n", "all").out
    assert "Connection refused" not in log, log[-3000:]
    stop_and_check(h, "mr")
    assert sorted(p.name for p in out.glob("rank*.pt")) == ["rank0.pt", "rank1.pt"], log[-3000:]


def test_without_record_the_root_cause_ranks_own_error_wins_over_its_peers(
    harness: Harness,
) -> None:
    """Rank 1 raises; rank 0 then dies of the closed connection. The cause is rank 1's own
    exception (torchrun's Root Cause names rank 1), never rank 0's consequential error."""
    h = harness
    _start(h, "pl", "plain")
    res = h.tc("wait", "pl", "--json", timeout=120)
    assert res.rc == 1, res
    cause = res.json()["cause"]  # type: ignore[index]
    assert cause["reason"] == "RuntimeError: shard 3 unreadable on rank 1", cause
    assert cause["rank"] == 1
    assert "Connection closed" not in cause["summary"]
    assert "(rank 1)" in cause["summary"]


def test_an_nccl_watchdog_timeout_names_its_rank(harness: Harness) -> None:
    h = harness
    _start(h, "wd", "watchdog")
    res = h.tc("wait", "wd", "--json", timeout=120)
    assert res.rc != 0, res
    cause = res.json()["cause"]  # type: ignore[index]
    assert cause["reason_class"] == "nccl-timeout", cause
    assert cause["rank"] == 1, cause


def test_a_sigkilled_rank_is_the_cause_not_its_peers_broken_pipe(harness: Harness) -> None:
    """Issue 44 §5: `kill -9` of rank 1's worker under torchrun without @record: rank 0
    then dies of the closed connection. The cause is rank 1's own end."""
    h = harness
    out = h.tmp / "out"
    out.mkdir()
    h.tc(
        "start", "--name", "k9", "--cwd", str(h.tmp), "--env", "OMP_NUM_THREADS=1",
        "--", TORCHRUN, "--standalone", "--nproc-per-node", "2", f"--master-port={free_port()}",
        str(TREES / "torch_train.py"), str(out),
        check=True,
    )  # fmt: skip
    wait_for(lambda: all((out / f"rank{r}.ready").exists() for r in range(2)), 90, "ranks")
    pids = h.job_pids("k9")
    main = h.state("k9")["main"]["pid"]

    def ppid(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])

    rank1 = next(  # torchrun's own child (not a DataLoader worker) with LOCAL_RANK=1
        pid
        for pid in pids
        if ppid(pid) == main
        and b"LOCAL_RANK=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    )
    kill_verified(rank1, pids[rank1])  # ours: a worker of this test's own job
    res = h.tc("wait", "k9", "--json", timeout=120)
    assert res.rc != 0, res
    cause = res.json()["cause"]  # type: ignore[index]
    assert cause["reason"] == "rank 1 killed by SIGKILL (exit code -9)", cause
    assert cause["rank"] == 1
    assert "Connection closed" not in cause["summary"]
