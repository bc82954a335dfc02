"""start / status / logs / restart / wait / rm / list, end to end with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TRAINCTL, Harness, alive, wait_for


def test_start_returns_once_exec_done_and_sets_job_env(harness: Harness) -> None:
    h = harness
    out = h.tmp / "env.txt"
    res = h.tc(
        "start",
        "--name",
        "envjob",
        "--json",
        "--env",
        "EXTRA=1",
        "--",
        "sh",
        "-c",
        f"env > {out}.tmp && mv {out}.tmp {out} && exec sleep 600",
        check=True,
    )
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["run"] == 1
    assert doc["main_pid"] > 0
    wait_for(out.exists, what="env dump")
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    st = h.state("envjob")
    assert env["TRAINCTL_JOB"] == st["marker"]
    assert env["TRAINCTL_NAME"] == "envjob"
    assert env["TRAINCTL_RUN"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["EXTRA"] == "1"
    assert env["TRAINCTL_PROGRESS"].endswith("run-1.progress.jsonl")
    s = h.tc("status", "envjob", "--json")
    assert s.rc == 0
    sd = s.json()
    assert isinstance(sd, dict)
    for key in (
        "name",
        "state",
        "main_pid",
        "pgid",
        "supervisor_pid",
        "run",
        "exit_code",
        "members",
    ):
        assert key in sd
    assert sd["state"] == "running"
    assert sd["main_pid"] == sd["pgid"] == doc["main_pid"]
    assert sd["members"] == 1
    h.tc("stop", "envjob", check=True)


def test_detached_start_closes_a_piped_stdout_at_once(harness: Harness) -> None:
    """The ssh-hang case: the caller's stdout pipe must reach EOF when start returns."""
    h = harness
    t0 = time.monotonic()
    p = subprocess.Popen(
        [*TRAINCTL, "start", "--name", "piped", "--", "sleep", "600"],
        env=h.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
    )
    out, err = p.communicate(timeout=10)  # returns only at EOF on both pipes
    assert p.returncode == 0, err
    assert time.monotonic() - t0 < 10
    assert b"started piped" in out
    # the job survives its starter's session going away (ssh logout)
    assert h.tc("status", "piped").rc == 0
    sup = h.state("piped")["supervisor"]
    for fd_path in Path(f"/proc/{sup['pid']}/fd").iterdir():
        target = os.readlink(fd_path)
        assert not target.startswith("pipe:") or fd_path.name not in ("0", "1", "2"), target
    h.tc("stop", "piped", check=True)


def test_job_survives_hangup_of_the_starting_session(harness: Harness) -> None:
    h = harness
    script = f"{' '.join(TRAINCTL)} start --name hup -- sleep 600; sleep 600"
    shell = subprocess.Popen(
        ["sh", "-c", script], env=h.env, start_new_session=True, stdout=subprocess.DEVNULL
    )
    wait_for((h.home / "jobs/hup/state.json").exists, what="job start")
    os.killpg(shell.pid, signal.SIGHUP)  # our own shell's session: the "logout"
    shell.wait(10)
    st = h.tc("status", "hup", "--json")
    assert st.rc == 0
    assert st.json()["state"] == "running"
    h.tc("stop", "hup", check=True)


def test_wait_returns_the_job_exit_code(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "w", "--", "sh", "-c", "sleep 0.3; exit 5", check=True)
    assert h.tc("wait", "w", "--timeout", "30").rc == 5
    s = h.tc("status", "w", "--json")
    assert s.rc == 3
    doc = s.json()
    assert isinstance(doc, dict)
    assert doc["state"] == "failed"
    assert doc["exit_code"] == 5
    h.tc("start", "--name", "sig", "--", "sh", "-c", "kill -TERM $$", check=True)
    assert h.tc("wait", "sig", "--timeout", "30").rc == 128 + signal.SIGTERM
    h.tc("start", "--name", "ok", "--", "true", check=True)
    assert h.tc("wait", "ok", "--timeout", "30").rc == 0
    assert h.state("ok")["phase"] == "exited"
    h.tc("start", "--name", "long", "--", "sleep", "600", check=True)
    assert h.tc("wait", "long", "--timeout", "0.3").rc == 124
    h.tc("stop", "long", check=True)


def test_finished_name_starts_next_run_and_keeps_logs(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "r", "--", "sh", "-c", "echo first", check=True)
    h.tc("wait", "r", "--timeout", "30")
    h.tc("start", "--name", "r", "--", "sh", "-c", "echo second; sleep 600", check=True)
    assert h.state("r")["run"] == 2
    wait_for(lambda: "second" in h.tc("logs", "r").out, what="run 2 output")
    assert h.tc("logs", "r", "--run", "1").out == "first\n"
    clash = h.tc("start", "--name", "r", "--", "sleep", "1")
    assert clash.rc == 1
    assert "is running" in clash.err
    h.tc("stop", "r", check=True)
    listed = h.tc("list", "--json", check=True).json()
    assert isinstance(listed, list)
    assert [j["name"] for j in listed] == ["r"]
    assert h.tc("rm", "r", check=True).rc == 0
    assert not (h.home / "jobs/r").exists()


def test_logs_tail_and_follow_across_restart(harness: Harness) -> None:
    h = harness
    code = h.tmp / "train.py"
    code.write_text("import time\nprint('version A', flush=True)\ntime.sleep(600)\n")
    h.tc(
        "start",
        "--name",
        "lg",
        "--cwd",
        str(h.tmp),
        "--grace",
        "1",
        "--",
        sys.executable,
        "train.py",
        check=True,
    )
    wait_for(lambda: "version A" in h.tc("logs", "lg", "-n", "1").out, what="first output")
    follower = subprocess.Popen(
        [*TRAINCTL, "logs", "lg", "-f"],
        env=h.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code.write_text("import time\nprint('version B', flush=True)\ntime.sleep(600)\n")
    r = h.tc("restart", "lg", "--json", check=True).json()
    assert isinstance(r, dict)
    assert r["start"]["run"] == 2
    assert r["stop"]["ok"]
    wait_for(lambda: "version B" in h.tc("logs", "lg").out, what="new code running")
    h.tc("stop", "lg", check=True)
    out, err = follower.communicate(timeout=20)  # follow ends by itself once the job ended
    for needle in ("version A", "==> lg run 2 <==", "version B"):
        assert needle in out, out + err
    assert out.index("version A") < out.index("version B")


def test_logs_follow_goes_on_through_a_policy_restarts_backoff(harness: Harness) -> None:
    """`logs -f` ends when the job has ended for good, not when a run failed and the
    restart policy waits its backoff to relaunch it (no lock is held meanwhile)."""
    h = harness
    h.tc(
        "start", "--name", "pr", "--no-wait", "--set", "restart=on-failure",
        "--set", "restart_backoff=1.5s", "--set", "max_restarts=1",
        "--", "sh", "-c", "echo run $TRAINCTL_RUN; sleep 1; exit 3",
        check=True,
    )  # fmt: skip
    follow = h.tc("logs", "pr", "-f", timeout=60)
    assert follow.rc == 0, follow
    for needle in ("run 1", "==> pr run 2 <==", "run 2"):
        assert needle in follow.out, follow.out
    assert h.state("pr")["phase"] == "failed"  # it followed to the very end


def test_restart_of_a_job_whose_supervisor_died(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "rs", "--", "sleep", "600", check=True)
    st = h.state("rs")
    sup = st["supervisor"]
    fd = os.pidfd_open(sup["pid"])
    signal.pidfd_send_signal(fd, signal.SIGKILL)  # our own supervisor (marked, verified)
    os.close(fd)
    wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), what="supervisor death")
    clash = h.tc("start", "--name", "rs", "--", "sleep", "1")
    assert clash.rc == 1
    assert "running" in clash.err
    r = h.tc("restart", "rs", "--json", check=True)
    doc = r.json()
    assert isinstance(doc, dict)
    assert doc["stop"]["via"] == "direct"
    assert h.state("rs")["run"] == 2
    h.tc("stop", "rs", check=True)


def test_status_fast_path_matches_click_path(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "fp", "--", "sleep", "600", check=True)
    slow_env = {**h.env, "TRAINCTL_NO_FASTPATH": "1"}
    for args in (
        ["status", "fp", "--json"],
        ["--home", str(h.home), "status", "fp", "--json"],
        ["status", "nope"],
    ):
        fast, slow = h.tc(*args), h.tc(*args, env=slow_env)
        assert fast.rc == slow.rc
        assert fast.err == slow.err
        if fast.rc == 0:
            f, s = fast.json(), slow.json()
            assert isinstance(f, dict)
            assert isinstance(s, dict)
            f.pop("uptime_s")
            s.pop("uptime_s")
            assert f == s
    h.tc("stop", "fp", check=True)


def test_start_follow_streams_until_the_job_ends(harness: Harness) -> None:
    h = harness
    res = h.tc(
        "start",
        "--name",
        "fol",
        "--follow",
        "--",
        "sh",
        "-c",
        "echo one; sleep 0.3; printf 'caf\\303\\251 two\\n'; exit 3",
    )
    assert res.rc == 1, res  # issue 44 §6: the run it followed failed: so does start -f
    assert "fol run 1 ended at once: exit code 3" in res.err
    assert "started fol run 1" in res.out
    assert "one\n" in res.out
    assert "café two\n" in res.out
    assert h.state("fol")["exit_code"] == 3


def test_follow_loses_and_repeats_no_line_of_a_job_that_writes_all_the_time(
    harness: Harness,
) -> None:
    """`start -f` and `logs -f` read the log, then follow it: a line written between the
    read and the follow's first look was lost (`restart --follow` missed a short run's
    only line under load). Every number, once and in order, from the first one printed."""
    h = harness
    n = 4000
    code = f"import time\nfor i in range({n}):\n    print(i, flush=True)\n    time.sleep(0.0005)\n"
    res = h.tc("start", "--name", "many", "--follow", "--", sys.executable, "-c", code)
    assert res.rc == 0, res
    assert [int(x) for x in res.out.splitlines() if x.isdigit()] == list(range(n))
    h.tc("start", "--name", "many2", "--", sys.executable, "-c", code, check=True)
    time.sleep(0.3)  # well into its lines
    got = [int(x) for x in h.tc("logs", "many2", "-f", "-n", "5").out.splitlines()]
    assert got == list(range(got[0], n)), (got[:8], len(got))
    assert len(got) > 5


def test_control_socket_is_private(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "sock", "--", "sleep", "600", check=True)
    jdir = h.home / "jobs" / "sock"
    assert (jdir / "control.sock").stat().st_mode & 0o777 == 0o600
    assert jdir.stat().st_mode & 0o777 == 0o700
    assert h.home.stat().st_mode & 0o777 == 0o700
    assert (jdir / "state.json").stat().st_mode & 0o777 == 0o600
    h.tc("stop", "sock", check=True)
    assert not (jdir / "control.sock").exists()
