"""The checkpoint guard (issue 54 §1, §2, §4, §5): no verb lets a checkpoint go back.

The trainer here has nanoGPT's shape, the one real trainers have far more often than
$TRAINCTL_RESUME_FROM: no signal handler, ``out/ckpt.pt`` rewritten in place (a zip, as
torch.save writes it) every SAVE_EVERY steps, the step only inside the file, and resume
by its own flag (``--init_from=resume``); ``--init_from=scratch`` left in the command
line starts over. Each test shows the checkpoint's step never going down.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zipfile
from pathlib import Path

from tests.conftest import Harness, wait_for
from trainctl.launcher.ops.history import _short
from trainctl.supervisor.model import keepsafe
from trainctl.supervisor.model.reports import Guard
from trainctl.supervisor.model.spec import Spec, Watch
from trainctl.supervisor.records import replace
from trainctl.supervisor.watch import guard, runsteps

TRAINER = """\
import json, os, signal, sys, time, zipfile
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
out = args["out_dir"]
ckpt = os.path.join(out, args.get("ckpt", "ckpt.pt"))
crash_at = int(args.get("crash_at", "0"))
crash_after = int(args.get("crash_after", "0"))  # steps after its start (or resume)
step = 0
if args.get("init_from") == "resume" and os.path.exists(ckpt):
    step = json.loads(zipfile.ZipFile(ckpt).read("archive/data.pkl"))["iter_num"]
began = step
print(f"start step={step} resume_from={os.environ.get('TRAINCTL_RESUME_FROM')}", flush=True)


def save(*_):
    with zipfile.ZipFile(ckpt, "w") as z:
        z.writestr("archive/data.pkl", json.dumps({"iter_num": step}) + " " * 20_000)


def save_and_exit(*_):  # a trainer that saves on SIGTERM
    save()
    os._exit(0)


if "--save_on_term" in sys.argv:
    signal.signal(signal.SIGTERM, save_and_exit)
first = True
while True:
    step += 1
    time.sleep(0.05)
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\\n")
    if first and "--early_save" in sys.argv:  # in place, before any guard can look
        save()
    first = False
    if crash_at and step >= crash_at or crash_after and step >= began + crash_after:
        raise SystemExit(f"crashed at step {step}")
    if step == 5 and "--early_keep" in sys.argv:  # one older checkpoint beside it
        with zipfile.ZipFile(os.path.join(out, "first.ckpt"), "w") as z:
            z.writestr("archive/data.pkl", json.dumps({"iter_num": step}))
    if step % 10 == 0:
        save()
"""


def saved_step(out: Path) -> int:
    data = zipfile.ZipFile(out / "ckpt.pt").read("archive/data.pkl")
    return int(json.loads(data)["iter_num"])


def last_step(h: Harness, name: str, run: int) -> int:
    p = h.home / "jobs" / name / "logs" / f"run-{run}.progress.jsonl"
    lines = p.read_text().splitlines() if p.exists() else []
    return int(json.loads(lines[-1])["step"]) if lines else 0


def log(h: Harness, name: str, run: int) -> str:
    p = h.home / "jobs" / name / "logs" / f"run-{run}.log"
    return p.read_text() if p.exists() else ""


def bed(h: Harness, *flags: str, init: str = "scratch") -> tuple[Path, list[str]]:
    """The trainer's folder and the start command of job ``gpt`` (not started)."""
    d = h.tmp / "gpt"
    (d / "out").mkdir(parents=True, exist_ok=True)
    (d / "train.py").write_text(TRAINER)
    argv = [
        "start", "--name", "gpt", "--cwd", str(d), "--grace", "5",
        "--set", "checkpoint=out/ckpt.pt",
        "--", sys.executable, "train.py", "--out_dir=out", f"--init_from={init}", *flags,
    ]  # fmt: skip
    return d / "out", argv


def first_run(h: Harness, argv: list[str], out: Path, saves: int = 2) -> int:
    """Start run 1, let it save ``saves`` times, stop it; the checkpoint's step."""
    h.tc(*argv, check=True)
    wait_for(lambda: last_step(h, "gpt", 1) >= 10 * saves + 1, 30, "run 1 to save")
    h.tc("stop", "gpt", check=True)
    return saved_step(out)


def ended(h: Harness, name: str = "gpt") -> dict:  # type: ignore[type-arg]
    """The job's state once its run has ended (the guard's stop included)."""
    wait_for(lambda: h.state(name)["phase"] in ("failed", "exited", "stopped"), 30, "the end")
    return h.state(name)


def test_a_start_that_starts_over_is_stopped_before_its_first_save(harness: Harness) -> None:
    h = harness
    out, argv = bed(h)
    step = first_run(h, argv, out)
    assert step >= 20
    res = h.tc(*argv, "--no-wait")  # the same command again: --init_from=scratch
    assert res.rc == 0, res
    assert "resuming from" in res.out, res.out  # handed, and named
    assert "guard: a first step below" in res.out, res.out
    st = ended(h)
    assert st["phase"] == "failed", st
    cause = st["cause"]
    assert cause["kind"] == "started-over", cause
    assert cause["summary"].startswith("started over at step 1; its checkpoint is at step")
    assert "(its command line says --init_from=scratch)" in cause["summary"]
    assert saved_step(out) == step  # never went back
    assert st["restart_history"] == []  # no restart would help: it would start over again
    g = st["guard"]
    assert g["kept"], g
    assert str(h.home) in g["kept"]
    assert g["kept"] in cause["summary"] or "was not changed" in cause["summary"]
    # the run was handed the checkpoint in its environment
    assert f"resume_from={out / 'ckpt.pt'}" in log(h, "gpt", 2)
    status = h.tc("status", "gpt").out
    assert "started over" in status, status
    # the supervisor's own diagnostic log (structlog, issue 55 §6) has the trip as a
    # warning, bound to the job and the run
    diag = [json.loads(x) for x in (h.home / "jobs" / "gpt" / "logs" / "supervisor.jsonl")
            .read_text().splitlines()]  # fmt: skip
    tripped = [x for x in diag if x["event"] == "guard_tripped"]
    assert [(x["level"], x["job"], x["run"]) for x in tripped] == [("warning", "gpt", 2)], diag


def test_a_run_that_overwrote_its_checkpoint_gets_the_kept_copy_back(harness: Harness) -> None:
    """The worst shape: the run saves in place at its first step, and on SIGTERM too."""
    h = harness
    out, argv = bed(h, "--early_save", "--save_on_term")
    # run 1 alone: its own first step's save is not a problem (nothing to protect yet)
    step = first_run(h, argv, out)
    assert step >= 20
    h.tc(*argv, "--no-wait", check=True)
    st = ended(h)
    assert st["cause"]["kind"] == "started-over", st["cause"]
    assert saved_step(out) == step  # put back: it had been rewritten at step 1
    assert "put back" in st["cause"]["summary"], st["cause"]
    assert st["guard"]["kept"] in st["cause"]["summary"]
    assert h.events("gpt", "guard_put_back")


def test_restart_resumes_by_default_and_the_guard_lets_a_resumed_run_go_on(
    harness: Harness,
) -> None:
    h = harness
    out, argv = bed(h, init="resume")
    step = first_run(h, argv, out)
    plan = h.tc("restart", "gpt", "--dry-run", "--json", check=True).json()
    assert plan["checkpoint"] == str(out / "ckpt.pt")
    assert plan["checkpoint_step"] == step  # the step the run reported before it saved
    assert plan["floor"] == step - 2
    assert plan["warning"] is None
    text = h.tc("restart", "gpt", "--dry-run", check=True).out
    assert "kept aside: a reflink, else a copy" in text, text
    assert h.state("gpt")["run"] == 1  # a dry run changes nothing
    h.tc("restart", "gpt", "--health", "1s", check=True)
    wait_for(lambda: last_step(h, "gpt", 2) > step + 12, 30, "run 2 to train and save")
    st = h.state("gpt")
    assert st["phase"] == "running", st
    assert st["guard"]["first_step"] == step + 1
    assert st["resumed_from"] == str(out / "ckpt.pt")
    shown = h.tc("status", "gpt", check=True).out
    assert f"guard handed {out / 'ckpt.pt'} (step ≈{step}), first step {step + 1}: resumed" in shown
    # it resumed: the copy kept aside (this ext4 has no reflinks: a copy) is dropped
    assert st["guard"]["kept"] is None
    assert st["guard"]["not_kept"].startswith("dropped: it resumed")
    assert not (h.home / "jobs" / "gpt" / "kept" / "run-2").exists()
    assert f"ckpt {out / 'ckpt.pt'} (step ≈" in shown  # its step is the log's estimate
    assert saved_step(out) > step
    h.tc("stop", "gpt", check=True)


def test_restart_of_a_scratch_command_says_so_and_trips(harness: Harness) -> None:
    h = harness
    out, argv = bed(h, "--save_on_term")
    step = first_run(h, argv, out)
    plan = h.tc("restart", "gpt", "--dry-run", check=True).out
    assert "warning: its command line says --init_from=scratch" in plan, plan
    res = h.tc("restart", "gpt", "--health", "5s")
    assert res.rc == 1, res  # the health window saw it end
    assert "started over" in res.out + res.err, res
    assert saved_step(out) == step  # SIGKILL: its SIGTERM save never ran


def test_from_scratch_starts_over_on_purpose_and_history_says_so(harness: Harness) -> None:
    h = harness
    out, argv = bed(h)
    first_run(h, argv, out)
    plan = h.tc("restart", "gpt", "--dry-run", "--from-scratch", "--json", check=True).json()
    assert plan["from_scratch"] is True
    assert plan["checkpoint"] is None
    res = h.tc("restart", "gpt", "--from-scratch", "--health", "1s", check=True)
    assert "from scratch" in res.out, res.out
    wait_for(lambda: last_step(h, "gpt", 2) >= 12, 30, "run 2 to train from scratch")
    st = h.state("gpt")
    assert st["phase"] == "running"
    assert st["from_scratch"] is True
    assert st["guard"] is None
    assert "resume_from=None" in log(h, "gpt", 2)
    started = h.events("gpt", "started")
    assert started[-1]["from_scratch"] is True
    rows = h.tc("history", "gpt", "--json", check=True).json()
    assert any("from scratch" in m for m in rows[-1]["marks"]), rows[-1]
    h.tc("stop", "gpt", check=True)
    assert saved_step(out) < 30


def test_a_policy_restart_that_starts_over_ends_the_job(harness: Harness) -> None:
    """restart = on-failure: run 1 crashes at step 25 (saved at 20); the policy's relaunch
    has the same scratch flag and is stopped at its first step, with no further restart."""
    h = harness
    out, argv = bed(h, "--crash_at=25")
    at = argv.index("--")
    argv[at:at] = ["--set", "restart=on-failure", "--set", "max_restarts=5"]
    h.tc(*argv, check=True)
    st = ended(h)
    assert st["run"] == 2, st  # one relaunch, stopped by the guard
    assert st["cause"]["kind"] == "started-over", st["cause"]
    assert saved_step(out) == 20


def test_a_start_with_bad_tolerance_is_one_line(harness: Harness) -> None:
    h = harness
    _, argv = bed(h)
    at = argv.index("--")
    res = h.tc(*argv[:at], "--set", "resume_tolerance=-3", *argv[at:])
    assert res.rc == 2, res
    assert "resume_tolerance" in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert not (h.home / "jobs" / "gpt").exists()


def test_tolerance_off_lets_a_run_start_over(harness: Harness) -> None:
    h = harness
    out, argv = bed(h)
    at = argv.index("--")
    argv[at:at] = ["--set", "resume_tolerance=off"]
    first_run(h, argv, out)
    res = h.tc(*argv, "--no-wait", check=True)
    assert "guard: off" in res.out, res.out
    wait_for(lambda: last_step(h, "gpt", 2) >= 5, 30, "run 2 to go on")
    assert h.state("gpt")["phase"] == "running"
    h.tc("stop", "gpt", check=True)
    assert os.path.exists(h.state("gpt")["guard"]["kept"])


def test_a_deploy_of_a_job_that_shows_no_progress_is_refused_before_anything_stops(
    harness: Harness,
) -> None:
    """No checkpoint glob, no progress_regex, nothing in $TRAINCTL_PROGRESS: a gate could
    never pass (it used to stop the run, fail "no progress within 5 s" and roll back)."""
    h = harness
    d = h.tmp / "blind"
    d.mkdir()
    (d / "run.py").write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    h.tc("start", "--name", "blind", "--cwd", str(d), "--", sys.executable, "run.py", check=True)
    res = h.tc("deploy", "blind", "--force")
    assert res.rc == 2, res
    assert "reports no progress" in res.err
    assert len(res.err.strip().splitlines()) == 1
    st = h.state("blind")
    assert (st["run"], st["phase"]) == (1, "running")
    h.tc("stop", "blind", check=True)


def test_history_tells_two_dirty_trees_on_one_commit_apart() -> None:
    assert _short("3adf61e1a2b3+5d41402abc") == "3adf61e1+5d41402a"
    assert _short("3adf61e1a2b3+9f00aa11") != _short("3adf61e1a2b3+5d41402a")
    assert _short("3adf61e1a2b3") == "3adf61e1"
    assert _short(None) == "?"


def test_the_breaker_ends_a_job_that_keeps_failing_with_no_complete_checkpoint(
    harness: Harness,
) -> None:
    """Killed in its very first save, a trainer's own resume picks the torn file and
    crashes, again and again: with no complete checkpoint at all the breaker on progress
    used to never fire (HF's get_last_checkpoint looped 7 times)."""
    h = harness
    d = h.tmp / "torn"
    (d / "out").mkdir(parents=True)
    (d / "out" / "ckpt.pt").write_bytes(b"PK\x03\x04" + b"torn" * 100)  # no end record
    (d / "run.py").write_text("raise SystemExit('cannot load out/ckpt.pt: torn')\n")
    h.tc(
        "start", "--name", "torn", "--cwd", str(d), "--set", "checkpoint=out/ckpt.pt",
        "--set", "restart=on-failure", "--set", "max_restarts=10",
        "--set", "restart_backoff=0.2s", "--", sys.executable, "run.py",
        check=True,
    )  # fmt: skip
    st = ended(h, "torn")
    assert st["phase"] == "failed", st
    cause = st["cause"]
    assert cause["kind"] == "no-progress", cause
    assert cause["summary"].startswith("no-progress: 3 restarts, no complete checkpoint")
    assert st["run"] == 4  # three restarts, then the breaker


def test_a_checkpoint_rewritten_in_place_is_judged_by_step_not_path(harness: Harness) -> None:
    """Lightning's last.ckpt is rewritten in place: a run that resumed from it, saved it
    again further on and then failed did not fail "right after resuming from it"; the
    relaunch is handed last.ckpt again, not the older checkpoint before it."""
    h = harness
    out, argv = bed(h, "--ckpt=last.ckpt", "--crash_after=15", "--early_keep", init="resume")
    argv[argv.index("checkpoint=out/ckpt.pt")] = "checkpoint=out/*.ckpt"
    at = argv.index("--")
    argv[at:at] = ["--set", "restart=on-failure", "--set", "max_restarts=2",
                   "--set", "restart_backoff=0.2s"]  # fmt: skip
    h.tc(*argv, check=True)
    wait_for(lambda: h.state("gpt")["run"] >= 3, 60, "two relaunches")
    wait_for(lambda: "start step=" in log(h, "gpt", 3), 30, "run 3 to start")
    assert f"resume_from={out / 'last.ckpt'}" in log(h, "gpt", 3), log(h, "gpt", 3)
    assert not h.events("gpt", "resume_skipped")
    ended(h)


def test_a_copy_aside_is_bounded_in_time_and_size(tmp_path: Path) -> None:
    """The supervisor answers the CLI within ready_timeout: a start copies its
    checkpoint aside for at most KEEP_COPY_S, and not at all over checkpoint_keep_max
    (a reflink or a hard link costs nothing and is always taken)."""
    src = tmp_path / "ckpt.pt"
    src.write_bytes(b"x" * (3 << 20))
    try:
        how = keepsafe.clone(str(src), str(tmp_path / "late"), time.monotonic() - 1.0)
    except TimeoutError:
        how = "timed out"
    assert how in ("reflink", "timed out")  # a copy past its deadline never completes
    spec = Spec(name="g", argv=("true",), cwd=str(tmp_path), env={},
                watch=Watch(checkpoint="ckpt.pt", checkpoint_keep_max=1 << 20))  # fmt: skip
    (tmp_path / "job").mkdir()
    g = guard.plan(tmp_path / "job", spec, 2, None)
    assert g is not None
    assert g.path == str(src)
    kept = guard.keep_aside(tmp_path / "job", 2, spec, g)
    if kept.kept_how != "reflink":
        assert kept.kept is None
        assert kept.not_kept is not None
        assert "over checkpoint_keep_max" in kept.not_kept
        assert not (tmp_path / "job" / "kept" / "run-2").exists()


def test_the_guard_floor_and_its_words() -> None:
    g = Guard("/o/ckpt.pt", 1.0, 10, step=1050.0, estimated=True, handed="/o/ckpt.pt",
              handed_step=1050.0, floor=1048.0)  # fmt: skip
    assert guard.below_floor(g, 0.0)
    assert guard.below_floor(g, 1047.0)
    assert not guard.below_floor(g, 1048.0)
    assert not guard.below_floor(replace(g, floor=None), 0.0)  # not armed
    line = guard.tripped_line(g, 0, ["python", "train.py", "--init_from=scratch"])
    assert line == (
        "started over at step 0; its checkpoint is at step ≈1050 "
        "(its command line says --init_from=scratch)"
    )
    for flag in ("--from-scratch", "--no_resume", "--resume=false", "resume_from_checkpoint=None"):
        assert guard.scratch_flag(["x", flag]) == flag
    for flag in ("--init_from=resume", "--resume", "--scratch_dir=/tmp", "--lr=3e-4"):
        assert guard.scratch_flag(["x", flag]) is None
    assert "did not resume from $TRAINCTL_RESUME_FROM=/o/ckpt.pt" in guard.tripped_line(
        g, 3, ["python", "train.py"]
    )


def deploy_a_change(h: Harness, argv: list[str]) -> dict:  # type: ignore[type-arg]
    """Start job gpt, let it save twice, change its code, deploy it (`--at now`): the
    deploy's report (it must fail: the new code's command line starts over)."""
    h.tc(*argv, check=True)
    wait_for(lambda: last_step(h, "gpt", 1) >= 25, 30, "run 1 to save twice")
    train = h.tmp / "gpt" / "train.py"
    train.write_text(train.read_text() + "# v2\n")
    res = h.tc("deploy", "gpt", "--at", "now", "--health", "20s", "--json", timeout=120)
    assert res.rc == 1, res
    rep = json.loads(res.out)
    assert isinstance(rep, dict)
    return rep


def test_a_deploy_whose_command_line_starts_over_never_takes_the_checkpoint_back(
    harness: Harness,
) -> None:
    """The issue's first shape: nanoGPT with `--init_from=scratch` in its command line,
    deployed with snapshot = "none" (no way back). The gate used to fail and leave the
    started-over run rewriting ckpt.pt (1050 -> 100 -> 350); now its own supervisor stops
    it at its first step, the job ends failed saying why, and the deploy names the copy."""
    h = harness
    out, argv = bed(h, "--save_on_term")
    rep = deploy_a_change(h, argv)
    handed = rep["checkpoint_step"]
    assert rep["outcome"] == "failed", rep
    assert "started over at step 1" in rep["cause"], rep
    assert "not rolled back" in rep["summary"]
    assert rep["kept"], rep  # named
    st = ended(h)
    assert (st["run"], st["phase"], st["cause"]["kind"]) == (2, "failed", "started-over")
    assert saved_step(out) >= handed  # never went back
    text = h.tc("deploy", "gpt", "--dry-run")  # the job is not running: one line
    assert text.rc == 1, text


def test_a_rollback_whose_command_line_starts_over_too_is_stopped_and_said(
    harness: Harness,
) -> None:
    """snapshot = "copy": the rollback run has the same scratch flag; it used to go
    unguarded and overwrite the checkpoint again, history saying "rolled-back"."""
    h = harness
    out, argv = bed(h)
    # a copy snapshot runs elsewhere: the checkpoint folder is given absolute (docs/deploy.md)
    argv[argv.index("checkpoint=out/ckpt.pt")] = f"checkpoint={out}/ckpt.pt"
    argv[argv.index("--out_dir=out")] = f"--out_dir={out}"
    at = argv.index("--")
    argv[at:at] = ["--set", "snapshot=copy"]
    rep = deploy_a_change(h, argv)
    assert rep["outcome"] == "failed", rep
    assert "which was stopped by the checkpoint guard: started over" in rep["summary"], rep
    assert rep["rollback_run"] == 3
    st = ended(h)
    assert (st["run"], st["cause"]["kind"]) == (3, "started-over")
    assert saved_step(out) >= rep["checkpoint_step"]
    rows = h.tc("history", "gpt", "--json", check=True).json()
    assert "rolled-back" not in json.dumps(rows[0]["marks"]), rows[0]


def test_a_checkpoint_written_before_its_runs_first_step_is_dated_by_that_run(
    tmp_path: Path,
) -> None:
    """Seen with torchrun: run 1 reached step 84 and was killed (its last save: 80); run
    2 resumed at 80 and, as nanoGPT does, saved again at once, before its first line,
    then failed. The checkpoint was dated by run 1's steps (84), and the guard stopped
    run 3, which had resumed correctly at 80. Only the run that wrote it dates it."""
    jdir = tmp_path / "job"
    (jdir / "logs").mkdir(parents=True)

    def progress(run: int, points: list[tuple[float, int]]) -> None:
        lines = [json.dumps({"step": s, "t": t}) for t, s in points]
        (jdir / "logs" / f"run-{run}.progress.jsonl").write_text("\n".join(lines) + "\n")

    progress(1, [(100.0 + i / 10, i) for i in range(85)])  # steps 0..84, until t=108.4
    progress(2, [(200.0 + i / 10, 80 + i) for i in range(5)])  # resumed: 80..84 from t=200
    spec = Spec(name="g", argv=("true",), cwd=str(tmp_path), env={})
    written = 199.5  # run 2 began at 195 and saved before its first line
    assert runsteps.step_before(jdir, 2, spec, written, run_started=195.0) == 79.0
    assert runsteps.step_before(jdir, 2, spec, 150.0, run_started=195.0) == 84.0  # run 1's
    assert runsteps.step_before(jdir, 2, spec, 200.25, run_started=195.0) == 82.0
