"""Upgrades under a running job (issue 55 §5): a pip upgrade (or a rollback) of trainctl
during a week-long run must never strand the run.

- A job started by the previous release (a pinned commit of this repository, `pip
  install`ed into its own venv) is driven by this CLI: status, logs, report, attach, each
  `stop --at`, restart and deploy; `doctor` names its supervisor as older than the CLI.
- The other way round: state and spec written by a newer trainctl. Unknown fields are
  ignored (the schema is additive within a version); a newer schema gets one line naming
  both versions and what still works (status and stop do), never "malformed".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.attach.test_attach import ECHO, _attach_proc
from tests.conftest import Harness, Result, wait_for
from tests.keeper.test_deploy import log, progress, repo, version

ROOT = Path(__file__).resolve().parents[2]
# The release before this one: the landing of issue 54 (stop 57). The test drives a job
# its CLI started, with this CLI.
PREVIOUS = "d5eb8fba9f7b037cffe07dcb990b7f5ca7b645df"


def _full_sha(short: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{short}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, (
        f"the previous release {short} is not in this clone ({out.stderr.strip()}): the "
        "upgrade test needs the repository's history (a full clone)"
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The previous release's CLI: its own venv, that commit `pip install`ed into it (no
    index: the dependencies are this environment's, reached through a .pth file)."""
    base = tmp_path_factory.mktemp("previous")
    src, venv = base / "src", base / "venv"
    src.mkdir()
    sha = _full_sha(PREVIOUS)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", sha], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py_dir = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / py_dir / "site-packages"
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    py = str(venv / "bin" / "python")
    where = subprocess.run(
        [py, "-c", "import trainctl.launcher as l; print(l.__file__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(site)), where.stdout  # the old code, not this one
    return [py, "-m", "trainctl.launcher"]


def old(h: Harness, cli: list[str], *args: str) -> Result:
    p = subprocess.run(
        [*cli, *args], env=h.env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert p.returncode == 0, f"previous trainctl {' '.join(args)} -> {p.returncode}\n{p.stderr}"
    return Result(p.returncode, p.stdout, p.stderr)


# Resumes from $TRAINCTL_RESUME_FROM, reports each step, saves every 20 steps on its own
# (`stop --at next-checkpoint`), on SIGUSR2 (`--at checkpoint`) and on SIGTERM.
TRAINER = """\
import json, os, signal, sys, time
VERSION = 1
ck = sys.argv[1]
flags = {"ck": False, "stop": False}
signal.signal(signal.SIGUSR2, lambda *a: flags.__setitem__("ck", True))
signal.signal(signal.SIGTERM, lambda *a: flags.__setitem__("stop", True))
resume = os.environ.get("TRAINCTL_RESUME_FROM")
step = int(open(resume).read()) if resume else 0
print(f"v{VERSION} resumed={resume} step={step}", flush=True)
def save():
    tmp = os.path.join(ck, ".tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, os.path.join(ck, f"ckpt-{step:06d}.txt"))
while True:
    step += 1
    with open(os.environ["TRAINCTL_PROGRESS"], "a") as f:
        f.write(json.dumps({"step": step}) + "\\n")
    if flags["ck"] or step % 20 == 0:
        save()
        flags["ck"] = False
    if flags["stop"]:
        save()
        sys.exit(0)
    time.sleep(0.05)
"""


def old_start(h: Harness, cli: list[str], r: Path, ck: Path, run: int) -> None:
    """Start (or start again) job `up` with the previous release."""
    old(h, cli, "start", "--name", "up", "--cwd", str(r), "--grace", "5",
        "--set", "snapshot=git", "--set", f"checkpoint={ck}/ckpt-*.txt",
        "--", sys.executable, "train.py", str(ck))  # fmt: skip
    wait_for(lambda: progress(h, "up", run) >= 3, 30, f"run {run} of the previous release")


def supervisor_code(h: Harness) -> str:
    """The interpreter the live supervisor was started with (its venv: its trainctl)."""
    pid = h.state("up")["supervisor"]["pid"]
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()


@pytest.mark.slow
def test_a_job_started_by_the_previous_release_is_driven_by_this_cli(
    harness: Harness, previous: list[str]
) -> None:
    h = harness
    r, ck = repo(h, trainer=TRAINER), h.tmp / "ck"
    ck.mkdir()
    old_start(h, previous, r, ck, 1)
    assert supervisor_code(h) == previous[0]
    # read: status, list, logs, report
    st = h.tc("status", "up", "--json", check=True).json()
    assert isinstance(st, dict)
    assert (st["state"], st["run"]) == ("running", 1)
    assert "up" in h.tc("list", check=True).out
    assert "resumed=None" in h.tc("logs", "up", check=True).out
    assert h.tc("report", "up", "--json", check=True).json()
    # doctor names the older supervisor, and what to do
    doctor = h.tc("doctor")
    older = [x for x in doctor.out.splitlines() if "job up" in x]
    assert any("older than this trainctl" in x for x in older), doctor.out
    # each --at, against the previous release's supervisor
    res = h.tc("stop", "up", "--at", "checkpoint", "--json", timeout=90, check=True).json()
    assert isinstance(res, dict)
    assert res["ok"] is True
    assert any(ck.glob("ckpt-*.txt"))
    old_start(h, previous, r, ck, 2)
    h.tc("stop", "up", "--at", "next-checkpoint", "--checkpoint-timeout", "60s", timeout=90,
         check=True)  # fmt: skip
    old_start(h, previous, r, ck, 3)
    # restart by this CLI: the next run is this release's, from the newest checkpoint
    h.tc("restart", "up", check=True, timeout=90)
    wait_for(lambda: progress(h, "up", 4) >= 3, 30, "run 4, this release's")
    assert supervisor_code(h) == sys.executable
    assert "older than this trainctl" not in h.tc("doctor").out
    h.tc("stop", "up", check=True)
    # deploy into a run of the previous release: its stop, this release's new run and gate
    old_start(h, previous, r, ck, 5)
    version(r, 2)
    rep = h.tc("deploy", "up", "--health", "30s", "--json", timeout=120, check=True).json()
    assert isinstance(rep, dict)
    assert rep["outcome"] == "deployed", rep
    assert "v2 resumed=" in log(h, "up", 6)
    h.tc("stop", "up", "--at", "now", check=True)
    rows = h.tc("history", "up", "--json", check=True).json()
    assert isinstance(rows, list)
    assert [row["run"] for row in rows] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_attach_to_a_terminal_the_previous_release_holds(
    harness: Harness, previous: list[str]
) -> None:
    h = harness
    old(h, previous, "start", "--name", "tty", "--tty", "--grace", "5", "--",
        sys.executable, "-c", ECHO)  # fmt: skip
    path = h.home / "jobs" / "tty" / "logs" / "run-1.log"
    wait_for(lambda: "ready" in path.read_text(errors="replace"), 20, "the job")
    writer = _attach_proc(h, "tty")  # this release's attach, the previous one's terminal
    try:
        assert writer.stdin is not None
        time.sleep(0.5)
        writer.stdin.write(b"hello\n")
        writer.stdin.flush()
        wait_for(lambda: "got hello" in path.read_text(errors="replace"), 10, "the typed line")
        assert h.tc("stop", "tty").rc == 0
        _, err = writer.communicate(timeout=20)
        assert writer.returncode == 0, err
        assert b"tty ended: stopped" in err
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()


# ---------------------------------------------------------------- the other way round


def _edit(path: Path, **changes: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def _quiet_job(h: Harness, name: str) -> Path:
    """A job that writes nothing more to its state once started (no members change)."""
    h.tc("start", "--name", name, "--grace", "2", "--", sys.executable, "-c",
         "import time; time.sleep(600)", check=True)  # fmt: skip
    wait_for(lambda: h.state(name)["snapshot_at"] is not None, 20, "its first snapshot")
    time.sleep(0.5)
    return h.home / "jobs" / name


def test_fields_a_newer_trainctl_added_are_ignored(harness: Harness) -> None:
    """The schema is additive within a version: unknown fields in state, spec and events
    change nothing (they used to be "malformed ... refusing to act on it", exit 4)."""
    h = harness
    jdir = _quiet_job(h, "fut")
    _edit(jdir / "state.json", future_field={"x": 1}, another=[1, 2])
    _edit(jdir / "spec.json", future_knob=3)
    with (jdir / "events.jsonl").open("a") as f:
        f.write(json.dumps({"event": "ended", "ts": time.time(), "run": 1, "phase": "failed",
                            "new_thing": True}) + "\n")  # fmt: skip
    st = h.tc("status", "fut", "--json", check=True).json()
    assert isinstance(st, dict)
    assert st["state"] == "running"
    assert "newer trainctl" not in h.tc("status", "fut", check=True).out
    h.tc("history", "fut", check=True)
    h.tc("list", check=True)
    h.tc("stop", "fut", check=True)


def test_a_newer_schema_gets_one_line_with_both_versions_and_status_and_stop_work(
    harness: Harness,
) -> None:
    h = harness
    jdir = _quiet_job(h, "fut")
    _edit(jdir / "state.json", schema=2, future_field=1)
    shown = h.tc("status", "fut")
    assert shown.rc == 0, shown
    assert "written by a newer trainctl (state schema 2; this trainctl reads 1)" in shown.err
    assert "running" in shown.out
    refused = h.tc("restart", "fut")
    assert refused.rc == 4, refused
    (line,) = refused.err.strip().splitlines()
    assert "(state schema 2; this trainctl reads 1)" in line, line
    assert "status and stop work" in line
    assert "malformed" not in line
    assert h.tc("stop", "fut").rc == 0
    wait_for(lambda: not (jdir / "control.sock").exists(), 20, "the supervisor's end")
