"""`trainctl adopt`: a run trainctl did not start (nohup, a tmux pane) is taken over as it
runs, stopped top-down with its checkpoint, and restarted under trainctl proper; what must
never be adopted is refused with one line and nothing changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TREES, Harness, kill_verified, marked, wait_for
from tests.gpu.test_gpus import fake_gpus
from tests.helpers import NEEDS_TORCH, free_port

CKPT = [sys.executable, str(TREES / "checkpointer.py")]
NEEDS_TMUX = pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")


def _start(h: Harness, out: Path, *, log: Path) -> subprocess.Popen[bytes]:
    """`nohup python checkpointer.py OUT 1 > log &`, as a user would have started it."""
    out.mkdir(exist_ok=True)
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            ["nohup", *CKPT, str(out), "1"],
            env={**h.env, "TREE_READY": str(out / "ready")},
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=h.tmp,
        )
    wait_for((out / "ready").exists, 20, "the trainer and its two loaders")
    return proc


def _gone(pids: dict[int, int]) -> bool:
    alive = marked_pids()
    return not any(alive.get(p) == s for p, s in pids.items())


def marked_pids() -> dict[int, int]:
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                raw = Path(f"/proc/{pid}/stat").read_bytes()
            except OSError:
                continue
            fields = raw.rpartition(b")")[2].split()
            if fields[0] != b"Z":
                out[int(pid)] = int(fields[19])
    return out


def _tree(h: Harness, root: int) -> dict[int, int]:
    """The test's own marked processes at or below ``root``: {pid: start}."""
    mine = marked(h.mark)
    kids: dict[int, list[int]] = {}
    for pid in mine:
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[1])
        except (OSError, IndexError):
            continue
        kids.setdefault(ppid, []).append(pid)
    out, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in mine:
            out[pid] = mine[pid][0]
        stack.extend(kids.get(pid, ()))
    return out


def test_a_nohup_run_is_adopted_by_pid_and_stops_with_its_checkpoint(
    mode_harness: Harness,
) -> None:
    """In cgroup mode the members move into the job's cgroup; in signals mode they are
    tracked by pidfd and their tree. The stop is the same top-down stop either way."""
    h = mode_harness
    signals = "cgroup = false" in Path(h.env["TRAINCTL_CONFIG"]).read_text()
    out, log = h.tmp / "out", h.tmp / "nohup.out"
    job = _start(h, out, log=log)
    bystander = _start(h, h.tmp / "same-argv", log=h.tmp / "other.out")  # the same command
    try:
        members = _tree(h, job.pid)
        assert len(members) == 3
        dry = h.tc("adopt", "nh", "--pid", str(job.pid), "--dry-run", "--json", check=True).json()
        assert isinstance(dry, dict)
        assert dry["main"] == job.pid
        assert sorted(m["pid"] for m in dry["members"]) == sorted(members)
        assert not (h.home / "jobs" / "nh").exists()  # a dry run changes nothing
        res = h.tc("adopt", "nh", "--pid", str(job.pid), "--yes", "--json", check=True).json()
        assert isinstance(res, dict)
        assert (res["run"], res["main_pid"], res["members"]) == (1, job.pid, 3)
        assert res["log_from"] == str(log)
        assert res["contained"] is (not signals)
        assert res["mode"] == ("signals" if signals else "cgroup")
        doc = h.tc("status", "nh", "--json").json()
        assert isinstance(doc, dict)
        assert doc["state"] == "running"
        assert doc["members"] == 3
        human = h.tc("status", "nh").out
        kept = "adopted, not contained" if signals else "contained in its own cgroup"
        assert f"adopted --pid {job.pid} at " in human
        assert kept in human
        if signals:  # and why, in words
            assert "not contained: cgroups are off in the config" in human
        doctor = h.tc("doctor", "--json").json()
        assert isinstance(doctor, list)
        [check] = [c for c in doctor if c["name"] == "job nh"]
        assert ("not contained" in check["value"]) is signals
        wait_for(lambda: "adopted; the output before this is in" in h.tc("logs", "nh").out, 10)
        stop = h.tc("stop", "nh", "--json", timeout=60)
        assert stop.rc == 0, stop
        assert (out / "ckpt.done").exists()  # it checkpointed with its loaders alive
        assert job.wait(10) is not None
        wait_for(lambda: _gone(members), 10, "every adopted process gone")
        assert bystander.poll() is None  # same argv, not adopted: untouched
        assert not (h.tmp / "same-argv" / "ckpt.done").exists()
        st = h.tc("status", "nh", "--json").json()
        assert isinstance(st, dict)
        assert st["state"] == "stopped"
        assert st["cause"]["summary"] == "stopped by trainctl stop"
    finally:
        for proc in (job, bystander):
            for pid, start in _tree(h, proc.pid).items():
                kill_verified(pid, start)
            proc.wait(10)


def test_an_adopted_main_that_exits_is_exited_with_an_unknown_code_and_restart_relaunches_it(
    harness: Harness,
) -> None:
    h = harness
    script = h.tmp / "short.py"
    script.write_text(
        "import sys, time\nprint('short run', flush=True)\ntime.sleep(2)\nsys.exit(3)\n"
    )
    with open(h.tmp / "short.out", "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, str(script)], env={**h.env, "GPUS_NOTE": "x"}, stdout=f, cwd=h.tmp
        )
    h.tc("adopt", "sh", "--pid", str(proc.pid), "--yes", check=True)
    proc.wait(20)
    res = h.tc("wait", "sh", "--timeout", "20", "--json")
    assert res.rc == 4  # the exit code of a process that is not ours to reap is unknown
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["state"] == "exited"
    assert doc["exit_code"] is None
    assert doc["cause"]["kind"] == "unknown"
    assert "exit code unknown (adopted" in doc["cause"]["summary"]
    # restart: the same command, cwd and environment, now started by trainctl itself
    h.tc("restart", "sh", "--health", "0", check=True)
    st = h.state("sh")
    assert st["run"] == 2
    assert st.get("adopted") is None
    spec = json.loads((h.home / "jobs" / "sh" / "spec.json").read_text())
    assert spec["argv"] == [sys.executable, str(script)]
    assert spec["cwd"] == str(h.tmp)
    assert spec["env"]["GPUS_NOTE"] == "x"
    res = h.tc("wait", "sh", "--timeout", "20")
    assert res.rc == 3  # trainctl's own child now: its exit code is known
    assert "short run" in h.tc("logs", "sh").out


@pytest.fixture
def tmux_server(harness: Harness) -> Iterator[list[str]]:
    """A private tmux server (its own socket): the test's, and stopped by the test."""
    sock = harness.tmp / "tmux.sock"
    tmux = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    yield tmux
    subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)


def _pane_pid(tmux: list[str], target: str) -> int:
    out = subprocess.run(
        [*tmux, "display-message", "-p", "-t", target, "#{pane_pid}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def _server_pid(tmux: list[str]) -> int:
    out = subprocess.run(
        [*tmux, "display-message", "-p", "#{pid}"], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@NEEDS_TMUX
def test_a_tmux_pane_is_adopted_and_stopped_leaving_the_server_and_other_panes(
    harness: Harness, tmux_server: list[str]
) -> None:
    h = harness
    tmux = tmux_server
    out, other = h.tmp / "out", h.tmp / "other"
    out.mkdir()
    other.mkdir()
    cmd = " ".join(["exec", *CKPT, "{}", "1"])
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "train", "-n", "job", cmd.format(out)],
        env={**h.env, "TREE_READY": str(out / "ready")},
        check=True,
    )
    subprocess.run([*tmux, "set-environment", "-g", "TREE_READY", str(other / "ready")], check=True)
    subprocess.run(
        [*tmux, "new-window", "-t", "train", "-n", "other", cmd.format(other)], check=True
    )
    wait_for(lambda: (out / "ready").exists() and (other / "ready").exists(), 20, "both panes")
    server, pane, bystander = (
        _server_pid(tmux),
        _pane_pid(tmux, "train:job"),
        _pane_pid(tmux, "train:other"),
    )
    sock = tmux[2]
    res = h.tc("adopt", "tp", "--tmux", "train:job", "--tmux-socket", sock, "--yes", "--json")
    assert res.rc == 0, res
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["main"] == pane
    assert doc["members"] == 3
    assert doc["log_from"] == "tmux pipe-pane"
    members = _tree(h, pane)
    stop = h.tc("stop", "tp", "--json", timeout=60)
    assert stop.rc == 0, stop
    assert (out / "ckpt.done").exists()
    wait_for(lambda: _gone(members), 10, "the pane's processes gone")
    for pid in (server, bystander):
        os.kill(pid, 0)  # alive: the server and the other pane were never signalled
    assert not (other / "ckpt.done").exists()
    assert "adopted --tmux train:job" in h.tc("logs", "tp").out


@NEEDS_TMUX
def test_a_pipeline_typed_at_a_shell_prompt_is_adopted_without_the_shell(
    harness: Harness, tmux_server: list[str]
) -> None:
    """Issue 44 §7: `python train.py | tee train.log` typed at a bash prompt in a pane.
    The shell (which ignores SIGTERM) was a member and the stop waited out its grace on
    it. Now the pane's foreground job is adopted, never the shell: after the stop the
    pipeline is gone, the shell and the pane live on at their prompt."""
    h = harness
    tmux = tmux_server
    out = h.tmp / "out"
    out.mkdir()
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "sh", "-n", "job", "bash --norc --noprofile -i"],
        env={**h.env, "TREE_READY": str(out / "ready")},
        check=True,
    )
    shell = _pane_pid(tmux, "sh:job")
    line = " ".join([*CKPT, str(out), "1"]) + f" | tee {h.tmp / 'train.log'}"
    subprocess.run([*tmux, "send-keys", "-t", "sh:job", line, "Enter"], check=True)
    wait_for((out / "ready").exists, 20, "the pipeline")
    res = h.tc(
        "adopt", "pipe", "--tmux", "sh:job", "--tmux-socket", tmux[2], "--yes", "--json",
    )  # fmt: skip
    assert res.rc == 0, res
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["main"] != shell
    members = _tree(h, doc["main"])
    assert shell not in members
    t0 = time.monotonic()
    stop = h.tc("stop", "pipe", "--json", timeout=60)
    assert stop.rc == 0, stop
    assert time.monotonic() - t0 < 30  # not the 60 s grace waited out on the shell
    assert (out / "ckpt.done").exists()  # the trainer checkpointed on its SIGTERM
    os.kill(shell, 0)  # the shell lives

    def at_prompt() -> bool:
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "sh:job"], capture_output=True, text=True,
            check=False,
        ).stdout.strip().splitlines()  # fmt: skip
        return bool(screen) and screen[-1].rstrip().endswith(("$", "#"))

    wait_for(at_prompt, 10, "the shell back at its prompt")


@NEEDS_TMUX
@NEEDS_TORCH[0]
@NEEDS_TORCH[1]
def test_a_torchrun_ddp_job_in_a_tmux_pane_is_adopted_and_every_rank_checkpoints(
    harness: Harness, tmux_server: list[str]
) -> None:
    h = harness
    tmux = tmux_server
    out = h.tmp / "out"
    out.mkdir()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = (
        f"OMP_NUM_THREADS=1 exec {torchrun} --standalone --nproc-per-node 2 "
        f"--master-port={free_port()} {TREES / 'torch_train.py'} {out}"
    )
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "ddp", "-n", "job", cmd], env=h.env, check=True
    )
    subprocess.run([*tmux, "new-window", "-t", "ddp", "-n", "shell", "sleep 600"], check=True)
    wait_for(lambda: all((out / f"rank{r}.ready").exists() for r in range(2)), 90, "2 ranks")
    server, bystander = _server_pid(tmux), _pane_pid(tmux, "ddp:shell")
    res = h.tc("adopt", "ddp", "--tmux", "ddp:job", "--tmux-socket", tmux[2], "--yes", "--json")
    assert res.rc == 0, res
    members = _tree(h, _pane_pid(tmux, "ddp:job"))
    assert len(members) >= 7  # torchrun, 2 ranks, 4 DataLoader workers
    stop = h.tc("stop", "ddp", "--json", timeout=90)
    assert stop.rc == 0, stop
    assert sorted(p.name for p in out.glob("rank*.pt")) == ["rank0.pt", "rank1.pt"]
    wait_for(lambda: _gone(members), 10, "every rank and worker gone")
    for pid in (server, bystander):
        os.kill(pid, 0)


def test_what_must_never_be_adopted_is_refused_in_one_line(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    sshd = tmp_path / "sshd"
    shutil.copy("/bin/sleep", sshd)  # a process whose name is sshd
    fake = subprocess.Popen([str(sshd), "600"], env=h.env)
    job = h.tc("start", "--name", "busy", "--", "sleep", "600", check=True)
    del job
    busy = h.state("busy")["main"]["pid"]
    cases = [
        (["--pid", "1"], "it is PID 1"),
        (["--pid", "2"], "kernel thread"),
        (["--pid", str(os.getpid())], "this command's own shell or one of its ancestors"),
        (["--pid", str(fake.pid)], "it is sshd"),
        (["--pid", str(busy)], "already a member of a trainctl job"),
        (["--pid", "999999999"], "no such process"),
        ([], "no job named 'x'"),
        (["--pid", "1", "--tmux", "x"], "one of --pid PID, --tmux TARGET or --gpu INDEX"),
    ]
    other = None
    if os.getuid() == 0:
        other = subprocess.Popen(["sleep", "600"], env=h.env, user=65534)
        cases.append((["--pid", str(other.pid)], "belongs to another user (uid 65534)"))
    try:
        for args, want in cases:
            res = h.tc("adopt", "x", *args, "--yes")
            assert res.rc == 2, (args, res)
            assert res.err.count("\n") == 1, res.err
            assert want in res.err, (args, res.err)
            assert not (h.home / "jobs" / "x").exists()
        assert h.tc("adopt", "../x", "--pid", str(fake.pid)).rc == 2
    finally:
        for p in (fake, other):
            if p is not None:
                p.kill()
                p.wait()
        h.tc("stop", "busy", check=True)


@NEEDS_TMUX
def test_the_tmux_server_itself_is_refused(harness: Harness, tmux_server: list[str]) -> None:
    h = harness
    tmux = tmux_server
    subprocess.run([*tmux, "new-session", "-d", "-s", "s", "sleep 600"], env=h.env, check=True)
    res = h.tc("adopt", "x", "--pid", str(_server_pid(tmux)), "--yes")
    assert res.rc == 2
    assert "tmux server" in res.err
    assert h.tc("adopt", "x", "--tmux", "nosuch", "--tmux-socket", tmux[2], "--yes").rc == 2


def test_a_lost_job_gets_a_new_supervisor_and_stops_through_it(harness: Harness) -> None:
    h = harness
    out = h.tmp / "out"
    out.mkdir()
    h.tc(
        "start", "--name", "lj", "--env", f"TREE_READY={out / 'ready'}",
        "--", *CKPT, str(out), "1", check=True,
    )  # fmt: skip
    wait_for((out / "ready").exists, 20, "the trainer")
    st = h.state("lj")
    sup = st["supervisor"]
    assert sup["pid"] in marked(h.mark)  # ours: started by this test's CLI
    kill_verified(sup["pid"], sup["start_ticks"])
    wait_for(lambda: h.tc("status", "lj").rc == 4, 10, "lost")
    assert h.tc("adopt", "nolost", "--yes").rc == 2  # no such job
    res = h.tc("adopt", "lj", "--yes", "--json")
    assert res.rc == 0, res
    doc = res.json()
    assert isinstance(doc, dict)
    assert (doc["run"], doc["members"], doc["main_pid"]) == (1, 3, st["main"]["pid"])
    status = h.tc("status", "lj", "--json").json()
    assert isinstance(status, dict)
    assert status["state"] == "running"
    assert status["supervisor_alive"] is True
    assert status["supervisor_pid"] != sup["pid"]
    again = h.tc("adopt", "lj", "--yes")
    assert again.rc == 2
    assert "is running" in again.err
    stop = h.tc("stop", "lj", "--json", timeout=60)
    assert stop.rc == 0, stop
    report = stop.json()
    assert isinstance(report, dict)
    assert report["via"] == "supervisor"
    assert (out / "ckpt.done").exists()
    assert not h.job_pids("lj")


def test_the_holders_of_a_gpu_are_adopted_and_the_stop_proves_it_released(
    harness: Harness,
) -> None:
    """GPUs through the fake backend (the one sanctioned double): a process trainctl did
    not start holds GPU 1; `adopt --gpu 1` takes it, leases GPU 1 with the memory the GPU
    uses without it as baseline, and the stop waits for that memory to be released."""
    h = harness
    fake_gpus(h, n=2)
    ready = h.tmp / "holder.ready"
    code = (
        f"import os,time\nfd=os.open({h.env['FAKE_DEV_DIR']!r}+'/nvidia1',os.O_RDWR)\n"
        f"open({str(ready)!r},'w').close()\ntime.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=h.env, start_new_session=True)
    try:
        wait_for(ready.exists, 10, "the GPU holder")
        assert h.tc("adopt", "g", "--gpu", "0", "--yes").rc == 2  # nobody holds GPU 0
        assert h.tc("adopt", "g", "--gpu", "7", "--yes").rc == 2
        assert h.tc("adopt", "g", "--gpu", "one", "--yes").rc == 2
        res = h.tc("adopt", "g", "--gpu", "1", "--yes", "--json")
        assert res.rc == 0, res
        doc = res.json()
        assert isinstance(doc, dict)
        assert doc["main_pid"] == proc.pid
        [lease] = h.state("g")["gpus"]
        assert lease["index"] == 1
        assert lease["baseline_used_bytes"] == 300 << 20  # the GPU without its holder
        # "released N GiB" is the memory the supervisor saw the run hold: its own look,
        # once it has opened the driver (the stop asks nothing before its signals)
        events = h.home / "jobs" / "g" / "events.jsonl"
        wait_for(lambda: '"event": "gpu_watch"' in events.read_text(), 20, "the GPU watch")
        stop = h.tc("stop", "g", "--json")
        assert stop.rc == 0, stop
        report = stop.json()
        assert isinstance(report, dict)
        [gpu] = report["report"]["gpus"]
        assert (gpu["index"], gpu["ok"]) == (1, True)
        assert gpu["released_bytes"] == 2048 << 20  # the holder's memory came back
        assert proc.wait(10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_members_that_come_and_go_during_adoption_are_handled(harness: Harness) -> None:
    """A shell forking a short-lived child every 10 ms: members exit between the plan and
    the handover. Those gone are left out, the rest (and later forks) are the job's."""
    h = harness
    proc = subprocess.Popen(
        ["sh", "-c", "while :; do sleep 0.01; done"], env=h.env, start_new_session=True
    )
    try:
        res = h.tc("adopt", "churn", "--pid", str(proc.pid), "--yes", "--json")
        assert res.rc == 0, res
        doc = res.json()
        assert isinstance(doc, dict)
        assert doc["main_pid"] == proc.pid
        assert h.tc("status", "churn").rc == 0
        stop = h.tc("stop", "churn", "--json")
        assert stop.rc == 0, stop
        assert proc.wait(10) is not None
        wait_for(lambda: not _tree(h, proc.pid), 10, "nothing of the shell left")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


EXITS = (
    "import sys, time\n"
    "open(sys.argv[1], 'w').close()\n"
    "for i in range(30):\n"
    "    print(f'tick {i}', flush=True)\n"
    "    time.sleep(0.1)\n"
    "print('leaving with code 3', flush=True)\n"
    "sys.exit(3)\n"
)


def test_an_adopted_runs_log_keeps_the_lines_written_just_before_it_exits(
    harness: Harness,
) -> None:
    """`setsid nohup python exits.py > run.out &`, adopted: its own file is copied into the
    run's log, and what it wrote in its last moment is there once `wait` returns."""
    h = harness
    out, ready = h.tmp / "run.out", h.tmp / "exits.ready"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            ["setsid", "nohup", sys.executable, "-c", EXITS, str(ready)],
            env=h.env, stdout=f, stderr=subprocess.STDOUT, cwd=h.tmp,
        )  # fmt: skip
    wait_for(ready.exists, 20, "the script to run")
    wait_for(lambda: b"tick 2" in out.read_bytes(), 20, "its first ticks")
    pid = int(proc.pid)
    h.tc("adopt", "ex", "--pid", str(pid), "--yes", check=True)
    h.tc("wait", "ex", "--timeout", "60")
    assert out.read_text().splitlines()[-1] == "leaving with code 3"
    assert h.tc("logs", "ex").out.splitlines()[-1] == "leaving with code 3"
    proc.wait(10)


NANOGPT_SHAPE = """
import json, os, sys, time, zipfile
os.makedirs("out", exist_ok=True)
it = 0
while True:
    if it % 10 == 0 and it > 0:  # its own schedule, in place, no handler (nanoGPT's shape)
        with zipfile.ZipFile("out/ckpt.pt", "w") as z:
            z.writestr("archive/data.pkl", json.dumps({"iter_num": it}))
    print(f"iter {it}: loss {1.0 / (it + 1):.4f}", flush=True)
    it += 1
    time.sleep(0.05)
"""


def test_an_adopted_nohup_run_gets_its_checkpoint_and_progress_by_set(harness: Harness) -> None:
    """Issue 54 §9: a nanoGPT run started with nohup had no `--at next-checkpoint` once
    adopted (no glob, no step); `adopt --set` gives it both."""
    h = harness
    d = h.tmp / "gpt"
    d.mkdir()
    (d / "train.py").write_text(NANOGPT_SHAPE)
    log = d / "nohup.out"
    with open(log, "wb") as f:
        job = subprocess.Popen(["nohup", sys.executable, "train.py"], env=h.env, stdout=f,
                               stderr=subprocess.STDOUT, cwd=d)  # fmt: skip
    try:
        wait_for((d / "out" / "ckpt.pt").exists, 20, "its first save")
        bad = h.tc("adopt", "g", "--pid", str(job.pid), "--yes", "--set", "cwd=/tmp")
        assert bad.rc == 2, bad
        assert "adopt --set cwd" in bad.err
        assert len(bad.err.strip().splitlines()) == 1
        assert not (h.home / "jobs" / "g").exists()  # refused before anything changed
        h.tc(
            "adopt", "g", "--pid", str(job.pid), "--yes",
            "--set", "checkpoint=out/ckpt.pt",
            "--set", r"progress_regex=iter (?P<step>\d+): loss (?P<loss>[\d.]+)",
            check=True,
        )  # fmt: skip
        plan = h.tc("stop", "g", "--dry-run", "--json", check=True).json()
        assert "next-checkpoint" in plan["can_at"], plan
        wait_for(lambda: "step" in h.tc("status", "g").out, 20, "a step in status")
        res = h.tc("stop", "g", "--at", "next-checkpoint", timeout=60)
        assert res.rc == 0, res
        saved = json.loads(zipfile.ZipFile(d / "out" / "ckpt.pt").read("archive/data.pkl"))
        last = max(int(x.split()[1].rstrip(":")) for x in log.read_text().splitlines()
                   if x.startswith("iter "))  # fmt: skip
        # it waited for the trainer's own save and stopped on seeing it, before the next
        # one (how soon after the save is bench's to measure: seen within 0.1 s, ~2 steps
        # here, 7 on a busy CI machine; an assertion of it failed there)
        assert "the job saved out/ckpt.pt: stopping it now" in res.out, res
        assert 0 <= last - saved["iter_num"] < 10, (last, saved)
    finally:
        for pid, start in _tree(h, job.pid).items():
            kill_verified(pid, start)
        job.wait(10)
