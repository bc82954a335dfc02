"""Goodput under one fixed fault schedule (issue 46): trainctl against plain torchrun.

A real 2-rank torchrun job (CPU, gloo, ~0.05 s steps, a save in place every SAVE_EVERY
steps: scripts/bench_goodput_trainer.py) goes through, at fixed times:

    1. SIGKILL of rank 1
    2. a hang: SIGSTOP of rank 1
    3. a good deploy (new code that resumes)
    4. a deploy whose new code starts from scratch
    5. a deploy whose new code fails at import
    6. a stop (trainctl: --at next-checkpoint), then a start

three times in one run, one after the other: under trainctl (restart policy, learned
stall deadline, deploy with its gate, probation and rollback), under plain
`torchrun --max-restarts 3` with each fault answered by hand (REACTION_S for a human to
notice a hang or an import failure; a start-over is not noticed at all, as in the
incident), and with no faults. It prints, for each: the steps kept (the step counter
reached at the end), that against the fault-free run's, and for each fault the seconds
until the step counter was past where it was when the fault came (time to resume, the
steps redone included). `trainctl report`'s goodput for the trainctl run.

    bash scripts/bench.sh --goodput     # ~9 minutes; needs the torch extra

``--issue-schedule`` runs issue 56's own five faults instead: the same, without the
scratch deploy (its broken deploy is the one that fails at import).

The broken deploy's new code imports a module that is not installed (a dependency added
to the code and not to the venv: "fails at import" as it happens), so trainctl's look at
the new code refuses it before anything is stopped (launcher/codecheck.py).
``--late-failure`` gives it code that fails at start in a way no look can see instead
(it raises once its imports are done), as every run before 2026-12-05 did: the stop, the
failed start and the rollback are then all paid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).parent
TRAINER = SCRIPTS / "bench_goodput_trainer.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
SAVE_EVERY = 40  # steps (~3 s)
FAULTS = [  # (seconds from the start, fault)
    (20.0, "kill rank"),
    (45.0, "hang rank"),
    (75.0, "good deploy"),
    (100.0, "scratch deploy"),
    (125.0, "import-fail deploy"),
    (150.0, "stop and start"),
]
END_S = 175.0
REACTION_S = 20.0  # by hand: how long a person takes to notice a hang or a failed start
LATE_FAILURE = False  # --late-failure: the broken deploy's code fails past its imports
MODES = {"good": "ok v2", "scratch": "scratch", "import-fail": "importfail"}


def tc(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINCTL_HOME": str(home), "TRAINCTL_START_WATCH": "0"}
    return subprocess.run(
        [sys.executable, "-m", "trainctl.launcher", *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids]


def rank1_of(torchrun_pid: int) -> int | None:
    """Our own torchrun's worker with LOCAL_RANK=1 (read from its environment)."""
    for pid in children(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"LOCAL_RANK=1" in env:
            return pid
    return None


def set_mode(code: Path, mode: str) -> None:
    (code / "mode").write_text(mode + "\n")


def new_code(code: Path, fault: str) -> None:
    """The deploy's code change: the trainer's mode, or for the broken deploy (unless
    --late-failure) an import of a module that is not installed."""
    kind = fault.split(maxsplit=1)[0]
    if kind == "import-fail" and not LATE_FAILURE:
        text = TRAINER.read_text().replace(
            "import torch\n", "import torch\nimport bench_new_dependency  # not installed\n", 1
        )
        (code / "train.py").write_text(text)
    else:
        set_mode(code, MODES[kind])


def mend(code: Path, mode: str) -> None:
    """Back to working code on disk, in ``mode``."""
    shutil.copy(TRAINER, code / "train.py")
    set_mode(code, mode)


def workdir(tmp: Path, name: str) -> tuple[Path, Path]:
    code, out = tmp / name / "code", tmp / name / "out"
    code.mkdir(parents=True)
    out.mkdir()
    shutil.copy(TRAINER, code / "train.py")
    set_mode(code, "ok")
    return code, out


def points(files: list[Path]) -> list[tuple[float, float]]:
    pts = []
    for f in files:
        for line in f.read_text().splitlines() if f.exists() else []:
            doc = json.loads(line)
            pts.append((float(doc["t"]), float(doc["step"])))
    return sorted(pts)


def resume_times(
    pts: list[tuple[float, float]], t0: float, end: float, runs: list[float] | None = None
) -> list[float]:
    """Per fault: seconds from the fault until the step counter passed where it was when
    the fault came, once the run was disrupted (a gap of 1 s, or the counter going back to
    a checkpoint) before the next fault (0: it was not; a refused deploy took the next
    fault's disruption for its own until 2026-12-05): the restart, the rendezvous, the
    load and the steps redone. ``runs``:
    when each run's first step came (trainctl's run files); then only a step of a run
    that began after the fault counts (a hung rank set going by the stall's stop ends
    its step: that is not the job back)."""
    out = []
    for k, (at, _) in enumerate(FAULTS):
        f = t0 + at
        nxt = t0 + FAULTS[k + 1][0] if k + 1 < len(FAULTS) else end
        before = [s for t, s in pts if t <= f]
        pre = before[-1] if before else 0.0
        disrupted, last_t, last_s, back = False, f, pre, end
        fresh = min((r for r in runs or [] if r > f), default=None)
        for t, s in (p for p in pts if p[0] > f):
            if not disrupted and t > nxt:  # not disrupted before the next fault: none
                break
            disrupted = disrupted or t - last_t >= 1.0 or s < last_s
            if disrupted and s > pre and (runs is None or (fresh is not None and t >= fresh)):
                back = t
                break
            last_t, last_s = t, s
        out.append(back - f if disrupted else 0.0)
    return out


def until(t0: float, at: float) -> None:
    time.sleep(max(0.0, t0 + at - time.monotonic()))


# ---------------------------------------------------------------- trainctl


def run_trainctl(tmp: Path, faults: bool) -> dict[str, object]:
    name = "tc" if faults else "free"
    code, out = workdir(tmp, name)
    home = tmp / name / "home"
    spec = tmp / name / "job.toml"
    spec.write_text(
        f'name = "{name}"\nargv = ["{TORCHRUN}", "--standalone", "--nproc-per-node", "2", '
        f'"train.py", "{out}", "{SAVE_EVERY}"]\ncwd = "{code}"\ngrace = "30s"\n'
        f'checkpoint = "{out}/ckpt.pt"\nsnapshot = "copy"\nrestart = "on-failure"\n'
        'max_restarts = 20\nrestart_backoff = "1s"\nstall_timeout = "auto"\n'
        'stall_action = "restart"\nenv = { OMP_NUM_THREADS = "1" }\n'
    )
    t0, wall0 = time.monotonic(), time.time()
    assert tc(home, "start", "-c", str(spec)).returncode == 0
    jdir = home / "jobs" / name
    for at, fault in FAULTS if faults else []:
        until(t0, at)
        st = json.loads((jdir / "state.json").read_text())
        main = (st.get("main") or {}).get("pid")
        victim = rank1_of(main) if main else None
        if fault == "kill rank" and victim:
            os.kill(victim, signal.SIGKILL)  # our own job's worker, found under our torchrun
        elif fault == "hang rank" and victim:
            os.kill(victim, signal.SIGSTOP)
        elif fault.endswith("deploy"):
            new_code(code, fault)
            r = tc(home, "deploy", name, "--at", "next-checkpoint", "--health", "60s",
                   "--probation", "15s", "--json")  # fmt: skip
            said = json.loads(r.stdout).get("outcome") if r.stdout.strip() else r.stderr.strip()
            print(f"  trainctl {fault}: {said}", flush=True)
            mend(code, "ok v3" if fault != "good deploy" else "ok v2")
        elif fault == "stop and start":
            tc(home, "stop", name, "--at", "next-checkpoint")
            tc(home, "start", "-c", str(spec))
    until(t0, END_S)
    tc(home, "stop", name)
    files = sorted(jdir.glob("logs/run-*.progress.jsonl"))
    report = json.loads(tc(home, "report", name, "--json").stdout)
    runs = [p for p in (points([f]) for f in files) if p]  # one progress file a run
    pts = sorted(pt for run in runs for pt in run)
    firsts = sorted(run[0][0] for run in runs)  # when each run's first step came
    return {
        "steps": pts[-1][1] if pts else 0.0,
        "resume_s": resume_times(pts, wall0, pts[-1][0] if pts else wall0, firsts)
        if faults
        else [],
        "goodput": report.get("goodput"),
        "lost_s": report.get("lost_s"),
        "parts": fault_parts(report.get("interruptions") or [], wall0) if faults else [],
    }


def fault_parts(interruptions: list[dict[str, object]], wall0: float) -> list[str]:
    """Each fault's parts, from `report --json`'s interruptions (issue 56 §1): the first
    run end at or after the fault's time is its interruption. The job's own restart is
    its restore (the interpreter, imports, rendezvous, the checkpoint's load); the rest
    (detect, stop: the job's exit on the signal included, down: the backoff included,
    redo) is what the fault cost beyond it (issue 56's target: 0.5 s)."""
    out = []
    for k, (at, fault) in enumerate(FAULTS):
        upto = wall0 + (FAULTS[k + 1][0] if k + 1 < len(FAULTS) else END_S) - 1.0
        hit = next((i for i in interruptions
                    if wall0 + at - 1.0 <= float(i["at"]) < upto and i.get("parts")), None)  # type: ignore[arg-type]  # fmt: skip
        if hit is None:
            out.append(f"{fault}: no interruption (nothing stopped, or no step after it)")
            continue
        p = hit["parts"]
        assert isinstance(p, dict)
        beyond = p["detect"] + p["stop"] + p["down"] + p["redo"]
        out.append(
            f"{fault}: detect {p['detect']:.1f}s, stop {p['stop']:.1f}s, down {p['down']:.1f}s "
            f"(backoff {p['backoff']:.1f}s), restore {p['restore']:.1f}s, redo {p['redo']:.1f}s"
            f"  -> {beyond:.1f}s beyond the job's own restart"
        )
    return out


# ---------------------------------------------------------------- plain torchrun, by hand


def start_torchrun(code: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
         "train.py", str(out), str(SAVE_EVERY)],
        cwd=code, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def end(p: subprocess.Popen[bytes], sig: int) -> None:
    """End our own torchrun's session: its process group (we started it: setsid)."""
    if p.poll() is None:
        os.killpg(p.pid, sig)
        if sig == signal.SIGKILL:
            os.killpg(p.pid, signal.SIGCONT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def sweep(marker: str) -> int:
    """SIGKILL what is left of our own peer arm: torchrun starts each worker in a session of
    its own, so a torchrun killed by hand (the hang's SIGKILL) leaves its workers behind, a
    SIGSTOPped one stopped for ever (as it would on a real box). Found by ``marker``, the
    arm's own temporary directory in their command line; each held by a pidfd and its
    command line read again through it before the signal. Returns how many."""
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if marker.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue  # read after the pidfd: the pid cannot have been reused since
            signal.pidfd_send_signal(fd, signal.SIGCONT)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            found += 1
        except OSError:
            continue  # gone
        finally:
            os.close(fd)
    return found


def run_peer(tmp: Path) -> dict[str, object]:
    code, out = workdir(tmp, "peer")
    try:
        return _run_peer(code, out)
    finally:
        left = sweep(str(out))
        if left:
            print(f"  (the peer arm left {left} worker(s) of a torchrun killed by hand: killed)")


def _run_peer(code: Path, out: Path) -> dict[str, object]:
    t0, wall0 = time.monotonic(), time.time()
    p = start_torchrun(code, out)
    last = "ok"  # the mode of the last code that ran
    for at, fault in FAULTS:
        until(t0, at)
        victim = rank1_of(p.pid)
        if fault == "kill rank" and victim:
            os.kill(victim, signal.SIGKILL)  # torchrun's --max-restarts takes it
        elif fault == "hang rank" and victim:
            os.kill(victim, signal.SIGSTOP)
            time.sleep(REACTION_S)  # someone notices the log stopped
            end(p, signal.SIGKILL)
            p = start_torchrun(code, out)
        elif fault.endswith("deploy"):
            end(p, signal.SIGTERM)  # Ctrl-C in the tmux pane, then the new code
            new_code(code, fault)
            p = start_torchrun(code, out)
            if fault == "import-fail deploy":
                time.sleep(REACTION_S / 2)  # the failure is on screen: back to the last code
                end(p, signal.SIGTERM)
                # the last code that ran (after a scratch deploy: nobody saw it start over;
                # runs before 2026-12-05 went back to it in the issue schedule too, which
                # has no scratch deploy: the peer started over there, 0.12 of fault-free)
                mend(code, last)
                p = start_torchrun(code, out)
            else:
                last = MODES[fault.split(maxsplit=1)[0]]
        elif fault == "stop and start":
            end(p, signal.SIGTERM)
            p = start_torchrun(code, out)
    until(t0, END_S)
    end(p, signal.SIGTERM)
    pts = points([out / "progress.jsonl"])
    return {
        "steps": pts[-1][1] if pts else 0.0,
        "resume_s": resume_times(pts, wall0, pts[-1][0] if pts else wall0),
    }


def main() -> None:
    global LATE_FAILURE
    args = sys.argv[1:]
    if not set(args) <= {"--issue-schedule", "--late-failure"}:
        sys.exit(f"usage: {sys.argv[0]} [--issue-schedule] [--late-failure]")
    if "--issue-schedule" in args:  # issue 56's five faults: no scratch deploy
        FAULTS[:] = [(at, f) for at, f in FAULTS if f != "scratch deploy"]
    LATE_FAILURE = "--late-failure" in args
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as d:
        tmp = Path(d)
        print(f"schedule: {', '.join(f'{f} at {a:g}s' for a, f in FAULTS)}; {END_S:g}s each")
        broken = "raises past its imports" if LATE_FAILURE else "imports a module not installed"
        print(f"the broken deploy's new code {broken}")
        free = run_trainctl(tmp, faults=False)
        print(f"no faults        steps {free['steps']:.0f}", flush=True)
        ours = run_trainctl(tmp, faults=True)
        peer = run_peer(tmp)
    base = float(free["steps"]) or 1.0  # type: ignore[arg-type]
    for label, r in (("trainctl", ours), ("torchrun+hand", peer)):
        kept = float(r["steps"])  # type: ignore[arg-type]
        per = ", ".join(
            f"{f} {s:.1f}s"
            for (_, f), s in zip(FAULTS, r["resume_s"], strict=False)  # type: ignore[arg-type]
        )
        print(f"{label:<16} steps {kept:.0f}  kept {kept / base:.3f} of fault-free")
        print(f"{'':<16} time to resume: {per}")
    print(f"trainctl report: goodput {ours['goodput']}, lost {ours['lost_s']}")
    for line in ours["parts"]:  # type: ignore[attr-defined]
        print(f"  {line}")


if __name__ == "__main__":
    main()
