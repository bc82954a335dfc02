"""Checkpoint-aware stop: SigCgt filtering, waiting for the new file, age requirements."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

from tests.conftest import TREES, Harness, wait_for


def start_trainer(h: Harness, name: str, *args: str, checkpoint: str = "ck/*.json") -> Path:
    sigs = h.tmp / f"{name}.signals"
    h.start_tree(
        name,
        "ckpt_trainer.py",
        str(h.tmp / "ck"),
        *args,
        grace=5,
        extra=("--env", f"TREE_SIGNALS={sigs}", "--set", f"checkpoint={checkpoint!r}"),
    )
    return sigs


def test_stop_checkpoint_then_stop(harness: Harness) -> None:
    h = harness
    sigs = start_trainer(h, "t")
    before = set((h.tmp / "ck").glob("*.json"))
    res = h.tc("stop", "t", "--checkpoint", "--checkpoint-timeout", "20")
    assert res.rc == 0, res.out + res.err
    lines = res.out.splitlines()
    assert lines[0].startswith("no checkpoint yet")
    assert "asking for a checkpoint (SIGUSR2)" in res.out
    assert "checkpoint written: ck/ckpt-main-" in res.out
    new = set((h.tmp / "ck").glob("*.json")) - before
    assert len(new) == 1
    log = sigs.read_text().split()
    assert log.count("SIGUSR2") == 1  # only the main catches it; its workers never got it
    assert log.count("SIGTERM") == 1
    assert not h.job_pids("t")
    # asked through the run's supervisor, which holds its processes (issue 55 §1)
    (asked,) = [e for e in h.events("t") if e["event"] == "checkpoint_asked"]
    assert (asked["signal"], asked["sent"]) == ("SIGUSR2", 1)


def test_agent_that_does_not_catch_is_spared(harness: Harness) -> None:
    """torchrun-like: the agent's default action for SIGUSR2 would kill it."""
    h = harness
    sigs = start_trainer(h, "ag", "--agent")
    res = h.tc("stop", "ag", "--checkpoint", "--json")
    assert res.rc == 0, res.err
    doc = res.json()
    assert isinstance(doc, dict)
    assert Path(doc["checkpoint"]["written"]["path"]).name.startswith("ckpt-rank")
    assert sigs.read_text().split().count("SIGUSR2") == 2  # both ranks, not the agent
    # the agent died of the stop's SIGTERM (143), not of a SIGUSR2 (140) it must never get
    assert doc["exit_code"] == 128 + signal.SIGTERM


def test_no_catcher_is_refused_before_any_signal(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "plain", "--set", "checkpoint='ck/*'", "--", "sleep", "600", check=True)
    main = h.state("plain")["main"]
    res = h.tc("stop", "plain", "--checkpoint")
    assert res.rc == 1
    assert "no process of job plain catches SIGUSR2" in res.err
    assert "nothing was signalled" in res.err
    assert h.tc("status", "plain").rc == 0  # still running
    assert Path(f"/proc/{main['pid']}").exists()
    h.tc("stop", "plain", check=True)


def test_checkpoint_flags_need_a_glob(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "nog", "--", "sleep", "600", check=True)
    res = h.tc("stop", "nog", "--checkpoint")
    assert res.rc == 2
    assert "no `checkpoint` glob" in res.err
    h.tc("stop", "nog", check=True)


def test_require_checkpoint_within(harness: Harness) -> None:
    h = harness
    ck = h.tmp / "ck"
    ck.mkdir()
    old = ck / "old.json"
    old.write_text("{}")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    h.tc(
        "start",
        "--name",
        "rq",
        "--set",
        "checkpoint='ck/*.json'",
        "--cwd",
        str(h.tmp),
        "--",
        "sleep",
        "600",
        check=True,
    )
    refused = h.tc("stop", "rq", "--require-checkpoint-within", "30m")
    assert refused.rc == 1
    assert "no checkpoint within 30m (the newest is 1h old)" in refused.err
    assert h.tc("status", "rq").rc == 0  # nothing was stopped
    st = h.tc("status", "rq", "--json").json()
    assert isinstance(st, dict)
    assert st["checkpoint"]["path"] == str(old)
    assert 3500 < st["checkpoint"]["age_s"] < 3700
    assert "ckpt " in h.tc("status", "rq").out
    refused_restart = h.tc("restart", "rq", "--require-checkpoint-within", "30m")
    assert refused_restart.rc == 1
    forced = h.tc("stop", "rq", "--require-checkpoint-within", "30m", "--force")
    assert forced.rc == 0
    assert "newest complete checkpoint: ck/old.json (1h00m old)" in forced.out


def test_progress_rate_eta_and_sparkline(harness: Harness) -> None:
    h = harness
    script = h.tmp / "prog.py"
    script.write_text(
        f"import sys, time\nsys.path.insert(0, {str(TREES.parent.parent)!r})\n"
        + "from trainctl.launcher import trainer\n"
        "for step in range(1, 10000):\n"
        "    trainer.report(step=step, loss=round(5.0 / step, 4), tokens_per_s=1000)\n"
        "    print(f'it {step} lr 0.1', flush=True)\n"
        "    time.sleep(0.02)\n"
    )
    h.tc(
        "start",
        "--name",
        "pg",
        "--set",
        "total_steps=5000",
        "--",
        sys.executable,
        str(script),
        check=True,
    )
    wait_for(
        lambda: (
            (h.tc("status", "pg", "--json").json() or {}).get("progress")  # type: ignore[union-attr]
            is not None
            and h.tc("status", "pg", "--json").json()["progress"]["step"] > 40
        )
    )  # type: ignore[index]
    doc = h.tc("status", "pg", "--json").json()
    assert isinstance(doc, dict)
    p = doc["progress"]
    assert p["metrics"]["loss"] > 0
    assert p["metrics"]["tokens_per_s"] == 1000
    assert 5 < p["steps_per_s"] < 200
    assert p["eta_s"] > 0
    assert p["total_steps"] == 5000
    human = h.tc("status", "pg").out
    assert "steps/s" in human
    assert "ETA" in human
    assert any(c in human for c in "▁▂▃▄▅▆▇█")
    h.tc("stop", "pg", check=True)


def test_progress_from_regex(harness: Harness) -> None:
    h = harness
    h.tc(
        "start",
        "--name",
        "rx",
        "--set",
        r"progress_regex='it (?P<step>\d+) lr (?P<lr>[\d.]+)'",
        "--set",
        "total_steps=100",
        "--",
        "sh",
        "-c",
        'for i in 1 2 3 4 5; do echo "it $i lr 0.5"; sleep 0.1; done; sleep 600',
        check=True,
    )
    wait_for(
        lambda: (
            ((h.tc("status", "rx", "--json").json() or {}).get("progress") or {})  # type: ignore[union-attr]
            .get("step")
            == 5
        )
    )
    doc = h.tc("status", "rx", "--json").json()
    assert isinstance(doc, dict)
    assert doc["progress"]["metrics"] == {"lr": 0.5}
    h.tc("stop", "rx", check=True)


def test_code_drift_is_flagged(harness: Harness) -> None:
    """The supervisor keeps the drift current (status only reads it), within a tick."""
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    repo = h.tmp / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("import time\ntime.sleep(600)\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    import subprocess  # noqa: PLC0415

    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], check=True)
    h.tc("start", "--name", "dr", "--cwd", str(repo), "--", sys.executable, "train.py", check=True)
    wait_for(lambda: h.state("dr").get("drift_checked_at") is not None, what="a first drift check")
    assert h.state("dr")["code"]["dirty"] is False

    def changed() -> list[str]:
        doc = h.tc("status", "dr", "--json").json()
        assert isinstance(doc, dict)
        return list(doc["code_changed"])

    assert changed() == []
    (repo / "train.py").write_text("import time\ntime.sleep(601)\n")  # an edit, uncommitted
    wait_for(lambda: "train.py edited" in changed(), 10, "the edit to show")
    assert "uncommitted changes differ" in changed()
    subprocess.run([*git, "commit", "-qam", "v2"], check=True)
    wait_for(lambda: any(c.startswith("git HEAD") for c in changed()), 10, "the commit")
    assert "CODE CHANGED on disk since start" in h.tc("status", "dr").out
    h.tc("restart", "dr", check=True)
    wait_for(lambda: h.state("dr")["run"] == 2 and h.state("dr").get("drift_checked_at"))
    assert changed() == []
    # a commit that changes no byte of the code (an empty one) is not a code change
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "v3"], check=True)
    time.sleep(1.0)  # 5 of the supervisor's ticks: the commit moved HEAD's mtime
    assert changed() == []
    assert "CODE CHANGED" not in h.tc("status", "dr").out
    h.tc("stop", "dr", check=True)


def test_stall_is_detected(harness: Harness) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    h.tc(
        "start",
        "--name",
        "st",
        "--set",
        "stall_timeout=1",
        "--",
        "sh",
        "-c",
        "echo hi; sleep 600",
        check=True,
    )
    wait_for(lambda: h.state("st").get("stalled_since") is not None, 20, "stall")
    s = h.tc("status", "st")
    assert "STALLED" in s.out
    assert '"stalled"' in (h.home / "jobs/st/events.jsonl").read_text()
    h.tc("stop", "st", check=True)


def test_stall_restart(harness: Harness) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    h.tc(
        "start",
        "--name",
        "sr",
        "--set",
        "stall_timeout=1",
        "--set",
        "on_stall='restart'",
        "--set",
        "restart_backoff=0.1",
        "--set",
        "max_restarts=1",
        "--grace",
        "0.5",
        "--",
        "sh",
        "-c",
        "echo run $TRAINCTL_RUN; sleep 600",
        check=True,
    )
    wait_for(lambda: h.state("sr")["run"] == 2, 30, "relaunch after the stall")
    assert h.state("sr")["last_failure"]["reason"] == "stalled"
    assert h.tc("logs", "sr").out == "run 2\n"
    h.tc("stop", "sr", check=True)


def test_eta_of_log_reported_progress_uses_a_recent_window(harness: Harness) -> None:
    """A run whose first minutes print no step must not look slow once it prints them.

    Steps come only from log lines (progress_regex), at a rate set by the clock (50/s) so
    that a loaded machine cannot change it, after an idle start. Dividing the steps seen
    by the time since start (the old ETA) gives about half the real rate here.
    """
    h = harness
    script = (
        "import time\n"
        "time.sleep(4)\n"
        "t0 = time.time()\n"
        "while True:\n"
        "    print(f'step {int((time.time() - t0) * 50)} loss 1.0', flush=True)\n"
        "    time.sleep(0.05)\n"
    )
    # samples every 5 snapshot intervals: 1 s here instead of 15 s
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    h.tc(
        "start",
        "--name",
        "eta",
        "--set",
        "progress_regex=step (?P<step>\\d+)",
        "--set",
        "total_steps=100000",
        "--",
        sys.executable,
        "-c",
        script,
        check=True,
    )
    samples = h.home / "jobs" / "eta" / "logs" / "run-1.steps.jsonl"
    wait_for(lambda: samples.exists() and len(samples.read_text().splitlines()) >= 3, 30)
    doc = h.tc("status", "eta", "--json").json()
    assert isinstance(doc, dict)
    rate = doc["progress"]["steps_per_s"]
    assert 35 < rate < 70, doc["progress"]
    assert doc["progress"]["eta_s"] < 100000 / 35
    h.tc("stop", "eta", check=True)


# nanoGPT's shape: no signal handler at all; saves ckpt.pt in place (a zip, as torch.save
# writes) every SAVE_EVERY steps, the step inside the file only; reports each step.
NO_HANDLER = """\
import json, os, sys, time, zipfile
out, every = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
step = 0
while True:
    step += 1
    time.sleep(0.04)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if step % every == 0:
        with zipfile.ZipFile(os.path.join(out, "ckpt.pt"), "w") as z:
            z.writestr("archive/data.pkl", json.dumps({"iter_num": step}) + " " * 200_000)
"""


def _start_no_handler(h: Harness, name: str, every: int = 25) -> Path:
    out = h.tmp / "out"
    h.tc(
        "start", "--name", name, "--set", f"checkpoint={out}/ckpt.pt",
        "--", sys.executable, "-c", NO_HANDLER, str(out), str(every),
        check=True,
    )  # fmt: skip
    return out


def _reported(h: Harness, name: str) -> int:
    lines = (h.home / "jobs" / name / "logs" / "run-1.progress.jsonl").read_text().splitlines()
    return max(int(json.loads(x)["step"]) for x in lines if x.strip())


def test_stop_at_next_checkpoint_loses_only_the_steps_of_the_stop(harness: Harness) -> None:
    """Issue 46 §2: a trainer with no handler that saves every 25 steps: the stop waits
    for its own next save (signalling nothing meanwhile), then goes at once."""
    h = harness
    out = _start_no_handler(h, "ng")
    wait_for((out / "ckpt.pt").exists, 30, "a first save")
    time.sleep(0.3)  # mid-way between two saves
    plan = h.tc("stop", "ng", "--dry-run", "--json", check=True).json()
    assert plan["can_at"] == ["now", "next-checkpoint"]
    assert "catches SIGUSR2" in plan["cannot_at"]["checkpoint"]
    refused = h.tc("stop", "ng", "--at", "checkpoint")
    assert refused.rc == 1
    assert "--at next-checkpoint" in refused.err  # the refusal names the way that works
    res = h.tc("stop", "ng", "--at", "next-checkpoint", timeout=60)
    assert res.rc == 0, res
    assert "stopping it now" in res.out
    assert str(out / "ckpt.pt") in res.out  # an absolute glob: printed as written
    saved = json.loads(zipfile.ZipFile(out / "ckpt.pt").read("archive/data.pkl"))["iter_num"]
    lost = _reported(h, "ng") - saved
    assert 0 <= lost <= 10, f"{lost} steps since the save were lost"  # ~0.4 s at 0.04 s/step
    assert not h.job_pids("ng")


def test_stop_at_next_checkpoint_bad_input_and_timeout(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "plain", "--", "sleep", "600", check=True)
    res = h.tc("stop", "plain", "--at", "next-checkpoint")
    assert res.rc == 2
    assert "checkpoint` glob" in res.err
    assert h.job_pids("plain")  # nothing changed
    res = h.tc("stop", "plain", "--at", "nxt-checkpoint")
    assert res.rc == 2
    assert "did you mean next-checkpoint" in res.err
    assert h.tc("stop", "plain", "--checkpoint", "--at", "now").rc == 2
    h.tc("stop", "plain", check=True)
    out = _start_no_handler(h, "slow", every=10_000)  # never saves within the timeout
    t0 = time.monotonic()
    res = h.tc("stop", "slow", "--at", "next-checkpoint", "--checkpoint-timeout", "2s")
    assert res.rc == 1, res
    assert "untouched" in res.err
    assert time.monotonic() - t0 < 15
    assert h.job_pids("slow")  # still running, untouched
    assert not (out / "ckpt.pt").exists()
    h.tc("stop", "slow", check=True)
