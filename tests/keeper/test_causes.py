"""Why a run ended, with real processes: the cause in status, list, wait, events, reports."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Harness, alive, kill_verified, wait_for
from tests.helpers import one_line_error
from trainctl.supervisor.life.causes import (
    Reason,
    ended_on_its_own,
    job_reason,
    tracebacks,
    unshuffled,
)

FAILS = textwrap.dedent(
    """
    import sys, time
    print("step 1", flush=True)
    time.sleep(0.2)
    def load_batch():
        raise RuntimeError(sys.argv[1] if len(sys.argv) > 1 else "boom in the loader")
    load_batch()
    """
)


def test_an_exception_is_the_cause_everywhere(harness: Harness) -> None:
    h = harness
    script = h.tmp / "fails.py"
    script.write_text(FAILS)
    h.tc("start", "--name", "f", "--", sys.executable, str(script), check=True)
    res = h.tc("wait", "f", "--json")
    assert res.rc == 1  # wait keeps the job's own exit code
    doc = res.json()
    assert isinstance(doc, dict)
    cause = doc["cause"]
    assert cause["kind"] == "exit"
    assert cause["exit_code"] == 1
    assert cause["reason"] == "RuntimeError: boom in the loader"
    assert cause["source"] == "log"
    st = h.tc("status", "f", "--json").json()
    assert isinstance(st, dict)
    assert st["cause"]["summary"] == "exit code 1: RuntimeError: boom in the loader"
    assert "cause exit code 1: RuntimeError: boom in the loader" in h.tc("status", "f").out
    assert "RuntimeError: boom in the loader" in h.tc("list").out
    [ended] = [e for e in h.events("f") if e["event"] == "ended"]
    assert ended["cause"]["reason"] == "RuntimeError: boom in the loader"
    assert ended["phase"] == "failed"


def test_a_signal_from_outside_is_named_as_such(harness: Harness) -> None:
    h = harness
    h.start_tree("sig", "ignore_signals.py")
    st = h.state("sig")
    main = st["main"]
    kill_verified(main["pid"], main["start_ticks"])  # SIGKILL, as an admin's kill -9 would
    res = h.tc("wait", "sig", "--json", timeout=30)
    assert res.rc == 128 + signal.SIGKILL
    doc = res.json()
    assert isinstance(doc, dict)
    cause = doc["cause"]
    assert cause["kind"] == "signal"
    assert cause["signal"] == "SIGKILL"
    assert cause["signal_from"] == "outside"
    assert "not sent by trainctl" in cause["summary"]


def test_a_stop_names_the_verb_and_its_escalation(harness: Harness) -> None:
    h = harness
    h.start_tree("esc", "ignore_signals.py", grace=0.5)
    doc = h.tc("stop", "esc", "--json", check=True).json()
    assert isinstance(doc, dict)
    cause = doc["cause"]
    assert cause["kind"] == "stopped"
    assert cause["by"] == "stop"
    assert cause["signal"] == "SIGKILL"
    assert cause["signal_from"] == "trainctl"
    assert "SIGKILLed after the 0.5 s grace" in cause["summary"]
    text = h.tc("status", "esc").out
    assert "cause stopped by trainctl stop, main SIGKILLed after the 0.5 s grace" in text


def test_restart_records_that_restart_stopped_the_run(harness: Harness) -> None:
    h = harness
    h.start_tree("rs", "fanout.py", "2", "1")
    h.tc("restart", "rs", check=True, timeout=60)
    ended = [e for e in h.events("rs") if e["event"] == "ended"]
    assert ended[-1]["cause"]["by"] == "restart"
    assert ended[-1]["cause"]["kind"] == "stopped"
    h.tc("stop", "rs", check=True)


def test_a_clean_exit_is_clean(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "ok", "--", sys.executable, "-c", "print('done')", check=True)
    doc = h.tc("wait", "ok", "--json").json()
    assert isinstance(doc, dict)
    assert doc["cause"]["kind"] == "clean"
    assert doc["exit_code"] == 0


def test_config_classes_classify_the_reason_and_restart_on_them(harness: Harness) -> None:
    """A [causes] class in the config names the failure, and restart_on may list it."""
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text('[causes]\nbad-shard = "shard \\\\d+ is corrupt"\n')
    script = h.tmp / "fails.py"
    script.write_text(FAILS)
    h.tc(
        "start", "--name", "cls", "--set", 'restart_on=["bad-shard"]', "--set", "max_restarts=1",
        "--set", "restart_backoff=0.1", "--", sys.executable, str(script), "shard 17 is corrupt",
        check=True,
    )  # fmt: skip
    res = h.tc("wait", "cls", "--json", timeout=60)
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["run"] == 2  # restarted once on its class, then the budget ran out
    assert doc["cause"]["kind"] == "restarts-exhausted"
    assert doc["cause"]["reason_class"] == "bad-shard"
    st = h.tc("status", "cls", "--json").json()
    assert isinstance(st, dict)
    [entry] = st["restart_history"]
    assert entry["matched"] == "bad-shard"
    assert "RuntimeError: shard 17 is corrupt" in entry["cause"]


def test_restart_on_an_exit_code_and_the_crash_loop_breaker(harness: Harness) -> None:
    h = harness
    script = h.tmp / "exits.py"
    # exits 29 on its first two runs, 1 on the third: restart_on ["exit:29"] restarts twice
    script.write_text(
        "import os, sys\nsys.exit(29 if int(os.environ['TRAINCTL_RUN']) < 3 else 1)\n"
    )
    h.tc(
        "start", "--name", "ex", "--set", 'restart_on=["exit:29"]', "--set", "max_restarts=5",
        "--set", "restart_backoff=0.1", "--", sys.executable, str(script), check=True,
    )  # fmt: skip
    doc = h.tc("wait", "ex", "--json", timeout=60).json()
    assert isinstance(doc, dict)
    assert (doc["run"], doc["exit_code"]) == (3, 1)  # exit 1 is not in restart_on
    assert doc["cause"]["kind"] == "exit"
    st = h.tc("status", "ex", "--json").json()
    assert isinstance(st, dict)
    assert [e["matched"] for e in st["restart_history"]] == ["exit:29", "exit:29"]
    assert "exit code 1" in st["error"]
    assert "restart_on" in st["error"]
    # the breaker: always exit 29, at most 2 restarts within 10 minutes
    always = h.tmp / "always.py"
    always.write_text("import sys\nsys.exit(29)\n")
    h.tc(
        "start", "--name", "loop", "--set", 'restart_on=["exit:29"]', "--set", "max_restarts=2",
        "--set", 'restart_window="10m"', "--set", "restart_backoff=0.1",
        "--", sys.executable, str(always), check=True,
    )  # fmt: skip
    doc = h.tc("wait", "loop", "--json", timeout=60).json()
    assert isinstance(doc, dict)
    assert doc["state"] == "failed"
    assert doc["run"] == 3
    assert doc["cause"]["kind"] == "crash-loop"
    assert "3 failures within 10m" in doc["cause"]["summary"]
    # issue 44 §5: the last failure is the run the policy gave up on, not the one before
    st = h.tc("status", "loop", "--json").json()
    assert isinstance(st, dict)
    assert st["last_failure"]["run"] == 3, st["last_failure"]
    assert "last failure: run 3" in h.tc("status", "loop").out


def test_a_lost_run_says_lost(harness: Harness) -> None:
    h = harness
    h.start_tree("lost", "fanout.py", "1", "1")
    sup = h.state("lost")["supervisor"]
    kill_verified(sup["pid"], sup["start_ticks"])
    wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), what="supervisor death")
    st = h.tc("status", "lost", "--json").json()
    assert isinstance(st, dict)
    assert st["state"] == "lost"
    assert st["cause"]["kind"] == "lost"
    h.tc("stop", "lost", check=True)
    st = h.tc("status", "lost", "--json").json()
    assert isinstance(st, dict)
    assert st["cause"]["summary"].endswith("(its supervisor was gone)")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("restart_on", '["exit:29", "oom", "made-up"]', "unknown cause 'made-up'"),
        ("restart_on", '["exit:0"]', "unknown cause 'exit:0'"),
        ("notify", '"ftp://example.com/x"', "is not an http(s) URL"),
        ("notify", '"https://"', "is not an http(s) URL"),
        ("on_failure", '"/nonexistent/notify.sh --now"', "on_failure: command not found"),
        ("memory_max", '"512K"', "below 1 MiB"),
        ("memory_max", '"lots"', "expected a size"),
        ("on_checkpoint_stale", '"true"', "needs checkpoint_stale"),
    ],
)
def test_bad_keeper_input_is_one_line_and_changes_nothing(
    harness: Harness, key: str, value: str, needle: str
) -> None:
    h = harness
    res = h.tc("start", "--name", "bad", "--set", f"{key}={value}", "--", "sleep", "5")
    one_line_error(res, 2, needle)
    assert not (h.home / "jobs" / "bad").exists()


def test_a_hook_that_is_not_executable_is_refused(harness: Harness) -> None:
    h = harness
    hook = h.tmp / "hook.sh"
    hook.write_text("#!/bin/sh\necho hi\n")
    hook.chmod(0o644)
    res = h.tc("start", "--name", "bad", "--set", f'on_exit="{hook}"', "--", "sleep", "5")
    assert res.rc == 2
    assert "on_exit: permission denied executing" in res.err
    assert not (h.home / "jobs" / "bad").exists()


def test_memory_caps_are_refused_in_signals_mode(harness: Harness) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[start]\ncgroup = false\n")
    res = h.tc("start", "--name", "bad", "--set", 'memory_max="1G"', "--", "sleep", "5")
    assert res.rc == 2
    assert "need cgroup mode" in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert not (h.home / "jobs" / "bad").exists()


WATCHDOG_ABORT = textwrap.dedent(
    """
    import os, sys
    for line in (
        "[rank1]:[E1202 03:12:09.123456 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600017 "
        "milliseconds before timing out.",
        "[rank1]: terminate called after throwing an instance of 'c10::DistBackendError'",
        "[rank1]:   what():  [PG 0 Rank 1] Process group watchdog thread terminated",
    ):
        print(line, file=sys.stderr, flush=True)
    os.abort()
    """
)


def test_an_nccl_watchdog_abort_names_the_rank_of_its_lines(harness: Harness) -> None:
    """c10d's watchdog lines carry `[rankN]:`, and no launcher names a root cause here:
    the rank comes from those prefixes (it was null)."""
    h = harness
    h.tc("start", "--name", "wd", "--", sys.executable, "-c", WATCHDOG_ABORT, check=True)
    res = h.tc("wait", "wd", "--json")
    assert res.rc == 128 + signal.SIGABRT, res
    cause = res.json()["cause"]  # type: ignore[index]
    assert cause["reason_class"] == "nccl-timeout", cause
    assert cause["rank"] == 1, cause
    assert "(rank 1)" in cause["summary"]


ROOT_KILLED_LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 40, in <module>
[rank0]:     dist.all_reduce(t)
[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer
E1203 10:00:01 torch/distributed/elastic/multiprocessing/api.py: failed (exitcode: -9)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_10:00:01
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_10:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4243)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4243
============================================================
"""


def test_a_root_cause_rank_without_a_traceback_is_its_own_exit(tmp_path: Path) -> None:
    """Issue 44 §5: rank 1 SIGKILLed; rank 0's 'Connection closed by peer' is only the
    consequence. The reason is rank 1's own exit, as torchrun's Root Cause block says."""
    log = tmp_path / "run-1.log"
    log.write_text(ROOT_KILLED_LOG)
    r = job_reason(log, None, 0.0, {})
    assert r.text == "rank 1 killed by SIGKILL (exit code -9)", r
    assert r.rank == 1
    # a CI run: the killed rank's DataLoader worker, cut off from it, printed its own
    # ConnectionResetError under rank 1's prefix; a SIGKILLed rank writes no traceback
    loader = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "multiprocessing/resource_sharer.py", line 145, in _serve\n'
        "[rank1]: ConnectionResetError: [Errno 104] Connection reset by peer\n"
    )
    log.write_text(loader + ROOT_KILLED_LOG)
    r = job_reason(log, None, 0.0, {})
    assert r.text == "rank 1 killed by SIGKILL (exit code -9)", r
    assert r.rank == 1
    # another CI run (four test workers on two cores): the worker read its index queue's
    # end instead, an EOFError, which is no consequence by its words; still not the rank's
    queue = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "torch/utils/data/_utils/worker.py", line 309, in _worker_loop\n'
        '[rank1]:   File "multiprocessing/connection.py", line 395, in _recv\n'
        "[rank1]: EOFError\n"
    )
    for before in (queue, queue.replace("[rank1]: ", "")):  # with torchrun's prefix or none
        log.write_text(before + ROOT_KILLED_LOG)
        r = job_reason(log, None, 0.0, {})
        assert r.text == "rank 1 killed by SIGKILL (exit code -9)", (before, r)
        assert r.rank == 1
    # a rank that exited with a code wrote its own traceback: that is its reason
    log.write_text(queue + ROOT_KILLED_LOG.replace("exitcode  : -9 (pid: 4243)", "exitcode  : 1"))
    assert job_reason(log, None, 0.0, {}).text == "EOFError"


def test_a_watchdog_line_that_names_its_rank_only_in_its_text(tmp_path: Path) -> None:
    log = tmp_path / "run-1.log"
    log.write_text(
        "step 10\n[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
        "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
    )
    r = job_reason(log, None, 0.0, {})
    assert r.klass == "nccl-timeout", r
    assert r.rank == 1, r


def test_two_ranks_failing_at_once_give_one_ranks_words() -> None:
    """Unbuffered stderr writes an exception's parts one by one: two ranks failing
    together interleaved them into one line, and the cause read
    ``exit code 1: ImportErrorImportError: : broken deploybroken deploy (rank 0)``."""
    tail = (
        "Traceback (most recent call last):\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        '  File "train.py", line 3, in <module>\n'
        "ImportErrorImportError: : broken deploybroken deploy\n"
    )
    assert tracebacks(tail)[-1][0] == "ImportError: broken deploy"
    assert unshuffled("RuntimeError: xRuntimeError: x") == "RuntimeError: x"
    for line in ("ValueError: bad", "KeyError: 'aabb'", "ok ok", "aabb"):
        assert unshuffled(line) == line  # only an exception line made wholly of pairs


def test_a_cause_names_its_rank_once() -> None:
    text = "rank 1 killed by SIGKILL (exit code -9)"
    cause = ended_on_its_own(137, None, Reason(text=text, rank=1))
    assert cause.summary.count("rank 1") == 1, cause.summary
    other = ended_on_its_own(1, None, Reason(text="RuntimeError: boom", rank=3))
    assert other.summary.endswith("(rank 3)"), other.summary
