"""`trainctl stack`: the Python stacks of a real job's processes, read with py-spy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import Harness, alive, kill_verified, wait_for
from tests.helpers import one_line_error

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time

    CHILD = "import time\\ndef child_sleeps():\\n    time.sleep(600)\\nchild_sleeps()\\n"

    def parent_waits(ready):
        open(ready, "w").close()
        time.sleep(600)

    kids = [subprocess.Popen([sys.executable, "-c", CHILD]), subprocess.Popen(["sleep", "600"])]
    time.sleep(0.3)  # the child interpreter is past its start-up
    parent_waits(sys.argv[1])
    """
)


@pytest.fixture
def job(harness: Harness) -> Harness:
    h = harness
    script = h.tmp / "stacked.py"
    script.write_text(SCRIPT)
    ready = h.ready_file("stacked")
    h.tc(
        "start", "--name", "st", "--env", "RANK=3", "--",
        sys.executable, str(script), str(ready), check=True,
    )  # fmt: skip
    wait_for(ready.exists, what="the job's tree")
    return h


def test_stack_groups_every_python_process_and_names_the_rest(job: Harness) -> None:
    h = job
    pids = set(h.job_pids("st"))
    doc = h.tc("stack", "st", "--json", check=True).json()
    assert isinstance(doc, dict)
    by_function = {g["frames"][0]["name"]: g for g in doc["groups"]}
    parent, child = by_function["parent_waits"], by_function["child_sleeps"]
    assert [t["rank"] for t in parent["threads"]] == ["3"]
    assert {t["pid"] for t in parent["threads"] + child["threads"]} <= pids
    assert parent["threads"][0]["pid"] != child["threads"][0]["pid"]
    [sleep] = [s for s in doc["skipped"] if s["cmd"].startswith("sleep")]
    assert sleep["why"] == "not a Python process"
    assert sleep["pid"] in pids
    text = h.tc("stack", "st", check=True).out
    assert "parent_waits (stacked.py:" in text
    assert "rank 3" in text
    assert f"skipped pid {sleep['pid']} sleep 600: not a Python process" in text
    assert set(h.job_pids("st")) == pids  # reading stacks signalled nothing, lost nothing
    h.tc("stop", "st", check=True)


@pytest.mark.parametrize("supervised", [True, False], ids=["supervisor", "direct"])
def test_a_stop_past_its_grace_keeps_the_stacks_of_what_it_kills(
    harness: Harness, supervised: bool
) -> None:
    h = harness
    h.start_tree("hung", "ignore_signals.py", grace=0.5)
    pids = h.job_pids("hung")
    if not supervised:  # the stop then runs in the CLI, from state.json
        sup = h.state("hung")["supervisor"]
        kill_verified(sup["pid"], sup["start_ticks"])
        wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), what="supervisor death")
    doc = h.tc("stop", "hung", "--json", check=True).json()
    assert isinstance(doc, dict)
    assert doc["via"] == ("supervisor" if supervised else "direct")
    report = doc["report"]
    assert report["killed"] == 4
    dump = json.loads(Path(report["stacks"]).read_text())
    assert {p["pid"] for p in dump["processes"]} == set(pids)
    assert all(p["threads"] and p["error"] is None for p in dump["processes"])
    frames = {f["name"] for p in dump["processes"] for f in p["threads"][0]["frames"]}
    assert "forever" in frames  # where tests/trees/_common.py parks them
    st = h.tc("status", "hung", check=False)
    assert f"stacks before SIGKILL: {report['stacks']}" in st.out


def test_a_stall_keeps_the_stacks_of_the_stalled_run(harness: Harness) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[supervisor]\nsnapshot_interval_s = 0.2\n")
    script = h.tmp / "quiet.py"
    script.write_text(
        "import time\nprint('up', flush=True)\n"
        "def stuck_here():\n    time.sleep(600)\n\nstuck_here()\n"
    )
    h.tc(
        "start", "--name", "q", "--set", "stall_timeout=1", "--",
        sys.executable, str(script), check=True,
    )  # fmt: skip
    path = h.home / "jobs" / "q" / "stacks" / "run-1.stall.json"
    wait_for(path.exists, 20, "the stacks of the stall")
    dump = json.loads(path.read_text())
    [proc] = dump["processes"]
    assert proc["pid"] in h.job_pids("q")
    assert proc["threads"][0]["frames"][0]["name"] == "stuck_here"
    assert f"stacks at the stall: {path}" in h.tc("status", "q").out
    assert '"stacks_written"' in (h.home / "jobs/q/events.jsonl").read_text()
    h.tc("stop", "q", check=True)


def test_stack_of_an_unknown_or_stopped_job(harness: Harness) -> None:
    h = harness
    one_line_error(h.tc("stack", "ghost"), 2, "no job named 'ghost'")
    h.tc("start", "--name", "done", "--", "true", check=True)
    h.tc("wait", "done", "--timeout", "30")
    doc = h.tc("stack", "done", "--json", check=True).json()
    assert doc == {
        "name": "done",
        "run": 1,
        "groups": [],
        "skipped": [],
        "elapsed_s": doc["elapsed_s"],
    }  # type: ignore[index]


TRACER = textwrap.dedent(
    """
    import ctypes, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_SEIZE = 0x4206  # attaches without stopping the tracee or signalling it
    if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) != 0:
        sys.exit(f"seize failed: errno {ctypes.get_errno()}")
    open(sys.argv[2], "w").close()
    time.sleep(600)  # the tracee is detached when this process exits
    """
)


def test_a_member_with_a_tracer_already_gets_the_real_cause_not_yama(harness: Harness) -> None:
    """py-spy cannot attach to a process that already has a tracer (an strace, a
    debugger): say so, with the tracer's pid, and not "run as root / set ptrace_scope"."""
    h = harness
    h.tc("start", "--name", "tr", "--", sys.executable, "-c", "import time; time.sleep(600)",
         check=True)  # fmt: skip
    main = h.state("tr")["main"]["pid"]
    ready = h.tmp / "traced"
    tracer = subprocess.Popen(
        [sys.executable, "-c", TRACER, str(main), str(ready)],
        env={**h.env, "TCTEST_BYSTANDER": "1"},
    )
    h.bystanders.append(tracer)
    wait_for(ready.exists, 10, "the tracer to seize the job's main")
    res = h.tc("stack", "tr", timeout=60)
    one_line_error(res, 1, f"pid {main} is already traced by pid {tracer.pid}")
    assert "ptrace_scope" not in res.err
    assert "as root" not in res.err
    tracer.kill()  # ours: started above
    tracer.wait()
    assert h.tc("stack", "tr", timeout=60).rc == 0  # no tracer: the stack is read
    assert h.tc("stop", "tr").rc == 0


def test_a_plain_install_brings_py_spy_and_doctor_says_stacks_work(harness: Harness) -> None:
    """py-spy is a default dependency where it has a wheel (this machine): no extra needed
    for `stack` and the stall and before-SIGKILL stacks; doctor says so."""
    import importlib.metadata  # noqa: PLC0415
    import platform  # noqa: PLC0415

    reqs = importlib.metadata.requires("trainctl") or []
    plain = [r for r in reqs if r.startswith("py-spy") and "extra ==" not in r]
    assert plain, reqs
    if platform.machine() in ("x86_64", "aarch64"):
        doc = harness.tc("doctor", "--json").json()
        assert isinstance(doc, list)
        [check] = [c for c in doc if c["name"] == "stacks"]
        assert check["ok"] is True
        assert "py-spy at" in check["value"]
