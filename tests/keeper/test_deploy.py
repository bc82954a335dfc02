"""`trainctl deploy` and `trainctl history` on real jobs in real git repositories: a
checkpoint, the verified stop, the new code resuming, the gate, the rollback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TRAINCTL, Harness, kill_verified, wait_for

# The job under deploy: it resumes from $TRAINCTL_RESUME_FROM, reports each step through
# $TRAINCTL_PROGRESS, checkpoints on SIGUSR2 and on SIGTERM (then exits 0). Its version
# line and MODE are what the tests edit and commit.
TRAINER = """\
import json, os, signal, sys, time
VERSION = 1
MODE = "ok"
ck = sys.argv[1]
flags = {"ck": False, "stop": False}
signal.signal(signal.SIGUSR2, lambda *a: flags.__setitem__("ck", True))
signal.signal(signal.SIGTERM, lambda *a: flags.__setitem__("stop", True))
step = 0
resume = os.environ.get("TRAINCTL_RESUME_FROM")
if resume:
    step = int(open(resume).read())
print(f"v{VERSION} resumed={resume} step={step}", flush=True)
if MODE == "crash" or (MODE == "fragile" and "fragile" in sys.argv[2:]):
    raise RuntimeError(f"v{VERSION} cannot load its model")
def save():
    tmp = os.path.join(ck, ".tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(ck, f"ckpt-{step:06d}.txt"))
while True:
    if MODE != "stuck":
        step += 1
        with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
            f.write(json.dumps({"step": step}) + "\\n")
    if flags["ck"] and "nockpt" not in sys.argv[2:]:  # this one never writes it
        save()
        flags["ck"] = False
    if flags["stop"]:
        save()
        sys.exit(0)
    time.sleep(0.05)
"""
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def repo(h: Harness, name: str = "repo", trainer: str = TRAINER) -> Path:
    """A git repository holding ``trainer`` as train.py, committed as v1."""
    r = h.tmp / name
    r.mkdir()
    (r / "train.py").write_text(trainer)
    subprocess.run([*GIT, "-C", str(r), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(r), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(r), "commit", "-qm", "v1"], check=True)
    return r


def head(r: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(r), "rev-parse", "HEAD"], capture_output=True, check=True
    )
    return out.stdout.decode().strip()


def version(r: Path, v: int, mode: str | None = None) -> str:
    text = (r / "train.py").read_text()
    text = text.replace(f"VERSION = {v - 1}", f"VERSION = {v}")
    if mode is not None:
        text = text.replace('MODE = "ok"', f'MODE = "{mode}"')
    (r / "train.py").write_text(text)
    subprocess.run([*GIT, "-C", str(r), "commit", "-qam", f"v{v}"], check=True)
    return head(r)


def start(h: Harness, name: str, r: Path, *more: str, snapshot: str = "git") -> Path:
    ck = h.tmp / f"ck-{name}"
    ck.mkdir()
    h.tc(
        "start", "--name", name, "--cwd", str(r), "--grace", "5",
        "--set", f"snapshot={snapshot}", "--set", f"checkpoint={ck}/ckpt-*.txt",
        *more, "--", sys.executable, "train.py", str(ck), *([name] if name else []),
        check=True,
    )  # fmt: skip
    wait_for(lambda: progress(h, name, 1) >= 3, 30, f"{name} to make progress")
    return ck


def progress(h: Harness, name: str, run: int) -> int:
    path = h.home / "jobs" / name / "logs" / f"run-{run}.progress.jsonl"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    return int(json.loads(lines[-1])["step"]) if lines else 0


def log(h: Harness, name: str, run: int) -> str:
    return (h.home / "jobs" / name / "logs" / f"run-{run}.log").read_text()


def test_a_deploy_resumes_the_new_code_from_a_fresh_checkpoint(harness: Harness) -> None:
    h = harness
    r = repo(h)
    (r / "train.py").write_text((r / "train.py").read_text() + "# an uncommitted edit\n")
    start(h, "d", r)
    snap = h.home / "jobs" / "d" / "snapshots" / "run-1"
    assert "# an uncommitted edit" in (snap / "train.py").read_text()  # dirty tree: in it
    first = h.tc("status", "d", "--json", check=True).json()
    assert first["code"]["dirty"] is True
    assert first["code"]["snapshot"] == "git"
    assert Path(first["code"]["diff_file"]).read_text().endswith("+# an uncommitted edit\n")
    assert first["source"] == str(r)
    assert f"(a snapshot of {r})" in h.tc("status", "d", check=True).out
    subprocess.run(["git", "-C", str(r), "checkout", "-q", "train.py"], check=True)
    v2 = version(r, 2)
    same = h.tc("deploy", "d", "--dry-run", "--json", check=True).json()
    assert same["at"] == "checkpoint"
    assert same["rollback_to"] == str(snap)
    res = h.tc("deploy", "d", "--health", "30s", "--json", timeout=90)
    assert res.rc == 0, res
    rep = res.json()
    assert rep["outcome"] == "deployed"
    assert rep["to_commit"] == v2[:12]
    ckpt = Path(rep["checkpoint"])
    assert ckpt.exists()
    resumed_at = int(ckpt.read_text())
    assert f"v2 resumed={ckpt} step={resumed_at}" in log(h, "d", 2)
    assert h.state("d")["run"] == 2
    assert progress(h, "d", 2) > resumed_at
    rows = h.tc("history", "d", "--json", check=True).json()
    assert [row["run"] for row in rows] == [1, 2]
    assert rows[1]["commit"] == v2
    assert rows[0]["commit"] != v2
    assert any("deploy out" in m for m in rows[0]["marks"])
    assert rows[0]["phase"] == "stopped"
    table = h.tc("history", "d", check=True).out
    assert v2[:8] in table
    assert h.tc("deploy", "d").rc == 2  # nothing changed since: one line, nothing done
    h.tc("stop", "d", check=True)


def test_new_code_that_fails_at_import_is_rolled_back_from_the_same_checkpoint(
    harness: Harness,
) -> None:
    h = harness
    r = repo(h)
    told = h.tmp / "told.txt"
    hook = json.dumps(
        [
            sys.executable,
            "-c",
            f"import os; open({str(told)!r}, 'w').write(os.environ['TRAINCTL_SUMMARY'])",
        ]
    )
    start(h, "d", r, "--set", f"on_deploy_failed={hook}")
    old = head(r)
    new = version(r, 2, mode="crash")
    res = h.tc("deploy", "d", "--health", "30s", "--json", timeout=90)
    assert res.rc == 1, res
    rep = res.json()
    assert rep["outcome"] == "rolled-back"
    assert (rep["from_commit"], rep["to_commit"]) == (old[:12], new[:12])
    assert "cannot load its model" in rep["cause"]
    assert rep["rollback_run"] == 3
    ckpt = rep["checkpoint"]
    at = int(Path(ckpt).read_text())
    wait_for(lambda: progress(h, "d", 3) > at, 30, "the rolled-back run to train on")
    assert f"v1 resumed={ckpt} step={at}" in log(h, "d", 3)  # the old code, same checkpoint
    wait_for(told.exists, 20, "on_deploy_failed")
    said = told.read_text()
    assert old[:12] in said
    assert new[:12] in said
    assert "cannot load its model" in said
    rows = h.tc("history", "d", "--json", check=True).json()
    assert rows[1]["phase"] == "failed (rolled back)"  # its own supervisor's one decision
    assert "rollback from run 2" in rows[2]["marks"]
    h.tc("stop", "d", check=True)
    # `report`'s parts of run 1's end run past run 2, which never stepped, to the
    # rollback's first step (the goodput bench showed another fault's parts for it)
    first = h.tc("report", "d", "--json", check=True).json()["interruptions"][0]
    assert first["run"] == 1, first
    assert first["parts"] is not None, first
    began = {e["run"]: e["ts"] for e in h.events("d") if e["event"] == "started"}
    assert first["parts"]["down"] >= began[3] - began[2], (first, began)  # run 2's life


@pytest.mark.parametrize("broken", ["syntax", "module"])
def test_new_code_that_cannot_start_is_refused_before_anything_stops(
    harness: Harness, broken: str
) -> None:
    """A typo, or an import of a module that is not installed, in the entry script or a
    module beside it: refused by the look at the new code, in one line that names the
    file and line, with the run, its code and its checkpoint untouched. --no-check goes
    ahead (and the gate rolls it back)."""
    h = harness
    r = repo(h)
    start(h, "d", r)
    pid = h.state("d")["main"]["pid"]
    second = "def net(:\n" if broken == "syntax" else "import flash_attn_not_here\n"
    (r / "model.py").write_text("import json\n" + second)
    (r / "train.py").write_text("import model\n" + (r / "train.py").read_text())
    subprocess.run([*GIT, "-C", str(r), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(r), "commit", "-qm", "v2"], check=True)
    for args in (["--dry-run"], ["--json"], []):
        res = h.tc("deploy", "d", *args, timeout=60)
        assert res.rc == 1, res
        assert res.out == ""
        (line,) = res.err.splitlines()
        want = "model.py:2: SyntaxError" if broken == "syntax" else "model.py:2: No module named"
        assert want in line, line
        assert "nothing was stopped" in line, line
        assert "--no-check" in line, line
    assert h.state("d")["run"] == 1
    assert h.state("d")["main"]["pid"] == pid
    assert not list((h.home / "jobs" / "d").glob("deploys/*.plan.json"))
    if broken == "syntax":
        res = h.tc("deploy", "d", "--no-check", "--health", "30s", "--json", timeout=90)
        assert res.rc == 1, res
        assert res.json()["outcome"] == "rolled-back"
        assert h.state("d")["run"] == 3
    h.tc("stop", "d", check=True)


def test_a_deploy_says_what_it_looked_at(harness: Harness) -> None:
    h = harness
    r = repo(h)
    start(h, "d", r)
    (r / "helper.py").write_text("import os\n")
    (r / "train.py").write_text("import helper\n" + (r / "train.py").read_text())
    # untracked: the git snapshot would not hold it, and the new run would not start
    res = h.tc("deploy", "d")
    assert res.rc == 1, res
    assert "helper.py (imported at train.py:1) is not in git" in res.err, res
    subprocess.run([*GIT, "-C", str(r), "add", "helper.py"], check=True)  # staged is enough
    plan = h.tc("deploy", "d", "--dry-run", check=True).out
    said = "train.py and 1 module(s) beside it compile; 7 import(s) placed"
    assert f"new code    {said}, by {sys.executable}" in plan, plan
    doc = h.tc("deploy", "d", "--dry-run", "--json", check=True).json()
    assert doc["code_check"]["problems"] == []
    assert doc["code_check"]["files"] == 2
    none = h.tc("deploy", "d", "--dry-run", "--no-check", "--json", check=True).json()
    assert none["code_check"] is None
    res = h.tc("deploy", "d", "--health", "30s", timeout=90)
    assert res.rc == 0, res
    assert "[new code] train.py and 1 module(s) beside it compile" in res.out
    h.tc("stop", "d", check=True)


def test_new_code_that_makes_no_progress_within_the_gate_is_rolled_back(
    harness: Harness,
) -> None:
    h = harness
    r = repo(h)
    start(h, "d", r)
    version(r, 2, mode="stuck")
    res = h.tc("deploy", "d", "--health", "2s", "--json", timeout=90)
    assert res.rc == 1, res
    rep = res.json()
    assert rep["outcome"] == "rolled-back"
    assert "no progress within 2 s" in rep["cause"]
    assert h.state("d")["run"] == 3
    wait_for(lambda: progress(h, "d", 3) > 0, 30, "the rolled-back run to train")
    h.tc("stop", "d", check=True)


def test_the_deploy_goes_on_when_its_cli_is_killed_during_the_gate(harness: Harness) -> None:
    h = harness
    r = repo(h)
    start(h, "d", r)
    version(r, 2, mode="stuck")
    cli = subprocess.Popen(
        [*TRAINCTL, "deploy", "d", "--health", "4s"],
        env=h.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert cli.stdout is not None
    for line in cli.stdout:
        if "[gate]" in line:
            break
    cli.kill()  # our own child: SIGKILL, mid-gate
    cli.communicate()
    deploys = h.home / "jobs" / "d" / "deploys"
    wait_for(lambda: any(deploys.glob("*.report.json")), 60, "the deploy's report")
    (report,) = deploys.glob("*.report.json")
    assert json.loads(report.read_text())["outcome"] == "rolled-back"
    assert h.state("d")["run"] == 3
    h.tc("stop", "d", check=True)


def test_rolling_stops_at_the_first_failure_and_leaves_the_rest_untouched(
    harness: Harness,
) -> None:
    h = harness
    r = repo(h)
    for name in ("a", "fragile", "c"):
        start(h, name, r)
    version(r, 2, mode="fragile")  # crashes only in the job started with "fragile"
    res = h.tc("deploy", "a", "fragile", "c", "--rolling", "--health", "30s", "--json", timeout=180)
    assert res.rc == 1, res
    doc = res.json()
    assert [d["outcome"] for d in doc["deploys"]] == ["deployed", "rolled-back"]
    assert doc["untouched"] == ["c"]
    assert "not touched: c" in res.err
    assert h.state("a")["run"] == 2
    assert h.state("fragile")["run"] == 3
    assert h.state("c")["run"] == 1  # untouched
    assert h.tc("deploy", "a", "c").rc == 2  # several names need --rolling
    for name in ("a", "fragile", "c"):
        h.tc("stop", name, check=True)


def test_a_checkpoint_that_never_comes_stops_nothing(harness: Harness) -> None:
    h = harness
    r = repo(h)
    start(h, "nockpt", r)  # it catches SIGUSR2 but never writes the checkpoint
    (r / "train.py").write_text((r / "train.py").read_text() + "# v2\n")
    pid = h.state("nockpt")["main"]["pid"]
    res = h.tc("deploy", "nockpt", "--checkpoint-timeout", "1s", "--json", timeout=60)
    assert res.rc == 1, res
    rep = res.json()
    assert rep["outcome"] == "failed"
    assert "nothing was stopped" in rep["summary"]
    assert h.state("nockpt")["run"] == 1
    assert h.state("nockpt")["main"]["pid"] == pid
    h.tc("stop", "nockpt", check=True)


def test_a_ctrl_c_before_the_stop_cancels_and_a_second_deploy_is_refused(
    harness: Harness,
) -> None:
    h = harness
    r = repo(h)
    start(h, "nockpt", r)  # the checkpoint wait goes on
    (r / "train.py").write_text((r / "train.py").read_text() + "# v2\n")
    cli = subprocess.Popen(
        [*TRAINCTL, "deploy", "nockpt", "--checkpoint-timeout", "60s"],
        env=h.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert cli.stdout is not None
    for line in cli.stdout:
        if "[checkpoint]" in line:
            break
    second = h.tc("deploy", "nockpt")
    assert second.rc == 1
    assert "already running" in second.err
    assert len(second.err.strip().splitlines()) == 1
    cli.send_signal(signal.SIGINT)  # our own child
    _, err = cli.communicate(timeout=60)
    assert "cancelled" in err
    assert h.state("nockpt")["run"] == 1
    assert h.state("nockpt")["phase"] == "running"
    h.tc("stop", "nockpt", check=True)


@pytest.mark.parametrize("phase", ["stopped", "queued", "lost", "missing"])
def test_a_deploy_into_a_job_that_does_not_run_is_one_line(harness: Harness, phase: str) -> None:
    h = harness
    r = repo(h)
    if phase == "missing":
        res = h.tc("deploy", "nosuch")
        assert res.rc == 2
    else:
        start(h, "d", r)
        if phase == "stopped":
            h.tc("stop", "d", check=True)
        elif phase == "lost":
            sup = h.state("d")["supervisor"]
            kill_verified(sup["pid"], sup["start_ticks"])  # this test's job's own supervisor
            wait_for(lambda: h.tc("status", "d").rc == 4, 20, "the supervisor to be lost")
        elif phase == "queued":
            h.tc("stop", "d", check=True)
            h.tc("start", "--name", "blocker", "--", "sleep", "60", check=True)
            h.tc(
                "start", "--name", "d", "--after", "blocker", "--cwd", str(r), "--",
                sys.executable, "train.py", str(h.tmp), check=True,
            )  # fmt: skip
        res = h.tc("deploy", "d")
        assert res.rc == 1, res
        assert phase in res.err or "not running" in res.err
        if phase == "lost":
            h.tc("stop", "d")
        if phase == "queued":
            h.tc("stop", "d")
            h.tc("stop", "blocker", check=True)
    assert len(res.err.strip().splitlines()) == 1, res.err


def test_a_copy_snapshot_over_its_cap_is_refused_before_anything_starts(
    harness: Harness,
) -> None:
    h = harness
    r = repo(h)
    (r / "data.bin").write_bytes(os.urandom(64 << 10))
    res = h.tc(
        "start", "--name", "big", "--cwd", str(r), "--set", "snapshot=copy",
        "--set", "snapshot_max=16384", "--", sys.executable, "train.py", str(h.tmp),
    )  # fmt: skip
    assert res.rc == 2, res
    assert "snapshot_max" in res.err
    assert not (h.home / "jobs" / "big" / "state.json").exists()
    ck = start(h, "small", r, "--set", "snapshot_exclude=['*.bin', '.git']", snapshot="copy")
    assert ck.exists()
    snap = h.home / "jobs" / "small" / "snapshots" / "run-1"
    assert (snap / "train.py").exists()
    # excluded from the copy: the snapshot reaches the source's own file by a link
    # (issue 46 §5: inputs left out of the code are read by the same relative path)
    assert (snap / "data.bin").is_symlink()
    assert (snap / "data.bin").resolve() == (r / "data.bin").resolve()
    time.sleep(0.1)
    h.tc("stop", "small", check=True)


def test_snapshots_are_kept_to_snapshot_keep_and_rm_unregisters_them(harness: Harness) -> None:
    h = harness
    r = repo(h)
    start(h, "k", r, "--set", "snapshot_keep=1")
    for v in (2, 3):
        version(r, v)
        # --force: run 1 has no checkpoint yet (--at now refuses that, issue 46)
        assert h.tc("deploy", "k", "--at", "now", "--health", "30s", "--force").rc == 0
    snaps = h.home / "jobs" / "k" / "snapshots"
    # keep 1, and the previous run's is always kept (a deploy's way back)
    assert sorted(p.name for p in snaps.iterdir()) == ["run-2", "run-3"]
    listed = subprocess.run(
        ["git", "-C", str(r), "worktree", "list"], capture_output=True, check=True
    )
    assert listed.stdout.decode().count("\n") == 3  # the repository and the two kept
    pruned = h.tc("prune", "--older-than", "1d", "--json", check=True).json()
    assert pruned["snapshots_removed"] == {"k": [2]}
    h.tc("stop", "k", check=True)
    h.tc("rm", "k", check=True)
    listed = subprocess.run(
        ["git", "-C", str(r), "worktree", "list"], capture_output=True, check=True
    )
    assert listed.stdout.decode().count("\n") == 1  # only the repository itself
