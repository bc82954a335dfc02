"""The queue: jobs that wait for GPUs, for other jobs, or for their turn.

Real processes throughout; the GPUs are the fake backend's (the one sanctioned double),
whose holders are real processes with the fake device file open. Each job here appends
"NAME start T" and "NAME end T" to a journal, so the tests read what really ran, when.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Harness, alive, kill_verified, marked, wait_for
from tests.gpu.test_gpus import fake_gpus
from tests.helpers import one_line_error

# argv: journal, name, seconds or gate, exit code. Holds the GPU it was given, as a trainer
# would. A gate (a path) makes the job run until the test creates that file: a verdict that
# needs a job to be still running must never rest on a sleep being long enough.
JOB = (
    "import os, sys, time\n"
    "cvd = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
    "fds = [os.open(os.environ['FAKE_DEV_DIR'] + '/nvidia' + i, os.O_RDWR)"
    " for i in cvd.split(',')] if cvd else []\n"
    "with open(sys.argv[1], 'a') as f: f.write(f'{sys.argv[2]} start {time.time()}\\n')\n"
    "gate = sys.argv[3]\n"
    "if gate.startswith('/'):\n"
    "    t = time.monotonic() + 120\n"
    "    while not os.path.exists(gate) and time.monotonic() < t: time.sleep(0.02)\n"
    "else: time.sleep(float(gate))\n"
    "with open(sys.argv[1], 'a') as f: f.write(f'{sys.argv[2]} end {time.time()}\\n')\n"
    "sys.exit(int(sys.argv[4]))\n"
)


def start(
    h: Harness, name: str, *flags: str, secs: float = 0.5, code: int = 0, gate: Path | None = None
) -> dict:  # type: ignore[type-arg]
    """Start the journal job as ``name`` with ``flags``; its --json document.

    With ``gate``, the job runs until that file exists instead of for ``secs``.
    """
    length = str(gate) if gate is not None else str(secs)
    res = h.tc(
        "start", "--name", name, "--grace", "1", "--json", *flags, "--",
        sys.executable, "-c", JOB, str(h.tmp / "journal"), name, length, str(code),
    )  # fmt: skip
    assert res.rc == 0, res
    doc = res.json()
    assert isinstance(doc, dict)
    return doc


def hold_gpu_0(h: Harness, gpus: int) -> None:
    """``gpus`` fake GPUs, and job ``hold`` running on GPU 0 (for 60 s, or until stopped)."""
    fake_gpus(h, gpus)
    start(h, "hold", "--gpus", "0", secs=60)
    wait_for(lambda: bool(journal(h)), 20, "the GPU holder to run")


def journal(h: Harness) -> list[tuple[str, str, float]]:
    path = h.tmp / "journal"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(name, what, float(at)) for name, what, at in rows]


def spans(h: Harness) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = {}
    for name, what, at in journal(h):
        out.setdefault(name, [0.0, 0.0])[0 if what == "start" else 1] = at
    return {k: (v[0], v[1]) for k, v in out.items()}


def ended(h: Harness, name: str) -> bool:
    return any(n == name and w == "end" for n, w, _ in journal(h))


def test_two_jobs_queued_for_one_gpu_run_one_after_the_other(harness: Harness) -> None:
    h = harness
    fake_gpus(h, 1)
    hook = h.tmp / "on_start"
    gate = h.tmp / "a.gate"
    start(h, "a", "--gpus", "0", gate=gate)
    b = start(h, "b", "--queue", "--gpus", "0", "--set", f"on_start=touch {hook}", secs=1.0)
    c = start(h, "c", "--queue", "--gpus", "0", secs=1.0)
    assert (b["state"], b["position"]) == ("queued", 1)
    assert "GPU 0 held by a" in b["waits_for"][0]
    assert (c["state"], c["position"]) == ("queued", 2)
    status = h.tc("status", "c", "--json").json()
    assert isinstance(status, dict)
    assert status["state"] == "queued"
    assert status["queue"]["position"] == 2
    listed = h.tc("list").out
    assert "queued" in listed
    assert "#1: GPU 0 held by a" in listed
    assert not hook.exists()
    gate.touch()  # a ends: b, then c, get GPU 0
    assert h.tc("wait", "c", "--timeout", "60").rc == 0  # waits through the queue
    got = spans(h)
    order = sorted(got, key=lambda n: got[n][0])
    assert order == ["a", "b", "c"]
    for first, second in itertools.pairwise(order):
        assert got[first][1] <= got[second][0], f"{first} and {second} overlapped: {got}"
    assert hook.exists()  # on_start ran when b was dispatched
    events = (h.home / "jobs" / "b" / "events.jsonl").read_text()
    assert '"event": "dispatched"' in events
    assert not list((h.home / "queue").glob("*.json"))


def test_after_ok_runs_after_a_clean_exit_and_fails_when_the_dependency_fails(
    harness: Harness,
) -> None:
    h = harness
    gate = h.tmp / "deps.gate"  # a and bad run until the dependents are queued
    start(h, "a", gate=gate)
    start(h, "bad", gate=gate, code=3)
    after_a = start(h, "next", "--after", "a:ok", secs=0.1)
    assert after_a["state"] == "queued"
    assert after_a["waits_for"] == ["after a:ok"]
    doomed = start(h, "doomed", "--after", "bad", secs=0.1)  # :ok by default
    either = start(h, "either", "--after", "bad:any", secs=0.1)
    assert doomed["state"] == either["state"] == "queued"
    gate.touch()
    assert h.tc("wait", "next", "--timeout", "60").rc == 0
    got = spans(h)
    assert got["a"][1] <= got["next"][0]
    wait = h.tc("wait", "doomed", "--timeout", "60")
    assert wait.rc == 1, wait
    doc = h.tc("status", "doomed", "--json").json()
    assert isinstance(doc, dict)
    assert doc["state"] == "failed"
    assert doc["cause"]["kind"] == "dependency"
    assert "after bad:ok, but bad run 1 ended failed (exit 3)" in doc["cause"]["summary"]
    assert "doomed" not in got  # it never ran
    assert h.tc("wait", "either", "--timeout", "60").rc == 0
    assert spans(h)["bad"][1] <= spans(h)["either"][0]


def test_after_any_of_a_job_that_left_the_queue_without_running_fails(harness: Harness) -> None:
    """Issue 44 §11: z never ran (its own dependency failed); y waited for z:any and ran."""
    h = harness
    gate = h.tmp / "gate"
    start(h, "w", gate=gate, code=3)
    assert start(h, "z", "--after", "w:ok", secs=0.1)["state"] == "queued"
    assert start(h, "y", "--after", "z:any", secs=0.1)["state"] == "queued"
    gate.touch()
    assert h.tc("wait", "y", "--timeout", "60").rc == 1
    doc = h.tc("status", "y", "--json").json()
    assert isinstance(doc, dict)
    assert doc["cause"]["kind"] == "dependency"
    assert "z run 1 left the queue without running" in doc["cause"]["summary"]
    assert "y" not in spans(h)  # it never ran


def test_stop_of_a_queued_job_dequeues_it_and_nothing_starts(harness: Harness) -> None:
    h = harness
    hold_gpu_0(h, 1)
    start(h, "later", "--queue", "--gpus", "0", secs=0.1)
    plain = h.tc("start", "--name", "later", "--", "true")  # not past the queue
    one_line_error(plain, 1, "already queued")
    stop = h.tc("stop", "later", "--json")
    assert stop.rc == 0, stop
    doc = stop.json()
    assert isinstance(doc, dict)
    assert doc["state"] == "dequeued"
    assert h.tc("status", "later").rc == 2  # gone: it never existed as a run
    assert h.tc("stop", "hold").rc == 0
    time.sleep(2.5)  # a dispatcher, had one survived, would have started it by now
    assert "later" not in spans(h)
    assert not (h.home / "jobs" / "later").exists()


def test_singleton_queues_a_second_start_of_the_same_name(harness: Harness) -> None:
    h = harness
    gate = h.tmp / "s.gate"
    first = start(h, "s", "--singleton", gate=gate)
    assert first["state"] == "running"  # nothing stood in its way
    wait_for(lambda: bool(journal(h)), 20, "the first run to begin")
    second = start(h, "s", "--singleton", secs=0.1)
    assert second["state"] == "queued"
    assert "singleton: s run 1 is running" in second["waits_for"][0]
    shown = h.tc("status", "s").out
    assert "running" in shown
    assert "next run 2 queued" in shown
    again = h.tc("start", "--name", "s", "--singleton", "--", "true")
    one_line_error(again, 1, "already queued")
    gate.touch()
    wait_for(lambda: h.state("s")["run"] == 2, 30, "the second run")
    assert h.tc("wait", "s", "--timeout", "30").rc == 0
    rows = journal(h)
    assert [w for _, w, _ in rows] == ["start", "end", "start", "end"]  # never together


def test_ten_queued_jobs_keep_their_order(harness: Harness) -> None:
    h = harness
    hold_gpu_0(h, 1)
    names = [f"j{i}" for i in range(10)]
    for n in names:
        assert start(h, n, "--queue", "--gpus", "0", secs=0.05)["state"] == "queued"
    queued = h.tc("queue", "--json").json()
    assert isinstance(queued, list)
    assert [q["name"] for q in queued] == names
    assert [q["queue"]["position"] for q in queued] == list(range(1, 11))
    assert h.tc("stop", "hold").rc == 0
    assert h.tc("wait", "j9", "--timeout", "90").rc == 0
    got = spans(h)
    assert sorted(names, key=lambda n: got[n][0]) == names


def test_backfill_lets_a_later_job_that_fits_go_first(harness: Harness) -> None:
    h = harness
    hold_gpu_0(h, 2)
    start(h, "big", "--queue", "--gpus", "0,1", secs=0.1)  # waits for GPU 0
    plain = start(h, "plain", "--queue", "--gpus", "1", secs=0.1)
    assert "first in, first out: behind big" in plain["waits_for"][0]
    filler = start(h, "filler", "--queue", "--backfill", "--gpus", "1", secs=0.1)
    assert filler["state"] == "running"  # GPU 1 is free: it goes ahead of big and plain
    time.sleep(2)
    assert "plain" not in spans(h)  # still behind big
    assert h.tc("stop", "hold").rc == 0
    assert h.tc("wait", "plain", "--timeout", "60").rc == 0
    got = spans(h)
    assert got["filler"][0] < got["big"][0] <= got["plain"][0]


def test_bad_queue_input_gets_one_line_and_changes_nothing(harness: Harness) -> None:
    h = harness
    cmd = ("--", "true")
    one_line_error(h.tc("start", "--name", "x", "--after", "nosuch", *cmd), 2, "no job named")
    one_line_error(h.tc("start", "--name", "x", "--after", "x", *cmd), 2, "dependency cycle")
    one_line_error(h.tc("start", "--name", "x", "--queue", *cmd), 2, "--queue waits for")
    one_line_error(h.tc("start", "--name", "x", "--after", "a:soon", *cmd), 2, "JOB:ok")
    one_line_error(h.tc("start", "--name", "x", "--backfill", *cmd), 2, "--backfill")
    assert h.tc("status", "x").rc == 2
    assert not (h.home / "queue").exists() or not list((h.home / "queue").glob("*.json"))


def test_queued_jobs_survive_their_waiter_and_queue_resume_dispatches_them(
    harness: Harness,
) -> None:
    """What a reboot leaves: the entry on disk, no waiter. `queue resume` picks it up."""
    h = harness
    start(h, "a", secs=60)
    start(h, "b", "--after", "a:any", secs=0.1)
    entry = json.loads((h.home / "queue" / "b.json").read_text())
    wait_for(lambda: "b.lock" in [p.name for p in (h.home / "queue").iterdir()], 10, "lock")
    pid, start_ticks = _waiter(h, "b")
    kill_verified(pid, start_ticks)
    wait_for(lambda: not alive(pid, start_ticks), 10, "the waiter killed")
    wait_for(lambda: "no waiter is running" in h.tc("status", "b").out, 10, "waiter gone")
    resumed = h.tc("queue", "resume", "--json").json()
    assert resumed == {"resumed": ["b"]}
    assert entry["token"] == json.loads((h.home / "queue" / "b.json").read_text())["token"]
    assert h.tc("stop", "a").rc == 0
    assert h.tc("wait", "b", "--timeout", "30").rc == 0
    assert ended(h, "b")


def _waiter(h: Harness, name: str) -> tuple[int, int]:
    """Our own waiter, (pid, start ticks), found by its exact argv (home and name) among
    the test's marked processes, never by a name match alone."""
    want = [b"-m", b"trainctl.launcher.waiter", str(h.home).encode(), name.encode()]
    for pid, (start_ticks, _) in marked(h.mark).items():
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[1:5] == want:
            return pid, start_ticks
    pytest.fail(f"no waiter for {name}")


def test_an_untrusted_entry_is_never_dispatched_and_holds_no_one_up(harness: Harness) -> None:
    h = harness
    hold_gpu_0(h, 1)
    start(h, "first", "--queue", "--gpus", "0", secs=0.1)
    start(h, "second", "--queue", "--gpus", "0", secs=0.1)
    wait_for((h.home / "queue" / "first.lock").exists, 10, "first's waiter")
    pid, start_ticks = _waiter(h, "first")
    entry = h.home / "queue" / "first.json"
    entry.write_text('{"name": "first", "token": 7}')  # hand-edited: a wrong type
    one_line_error(h.tc("status", "first"), 4, "first.json")
    assert h.tc("stop", "hold").rc == 0
    assert h.tc("wait", "second", "--timeout", "60").rc == 0
    assert "first" not in spans(h)  # never acted on
    entry.unlink()  # what the error line says to do
    wait_for(lambda: not alive(pid, start_ticks), 10, "the untrusted entry's waiter to exit")


def test_an_entry_left_by_a_dispatcher_killed_after_its_start_is_not_run_twice(
    harness: Harness,
) -> None:
    """What a dispatcher killed between starting a job and removing its entry leaves: the
    entry, and a run recorded after it was queued. The next dispatcher drops the entry."""
    h = harness
    start(h, "b", secs=0.1)
    wait_for(lambda: ended(h, "b"), 20, "b's run")
    assert h.tc("wait", "b", "--timeout", "20").rc == 0
    queued_at = h.state("b")["started_at"] - 5  # it was queued, then dispatched
    spec = json.loads((h.home / "jobs" / "b" / "spec.json").read_text())
    entry = {"name": "b", "token": "0" * 32, "seq": 1, "queued_at": queued_at, "spec": spec}
    (h.home / "queue").mkdir(mode=0o700, exist_ok=True)
    (h.home / "queue" / "b.json").write_text(json.dumps(entry))
    assert h.tc("queue", "resume", "--json").json() == {"resumed": ["b"]}
    wait_for(lambda: not (h.home / "queue" / "b.json").exists(), 10, "the stale entry dropped")
    time.sleep(0.5)
    assert [w for n, w, _ in journal(h) if n == "b"] == ["start", "end"]  # ran once
    assert h.state("b")["run"] == 1


def test_stop_all_dequeues_before_it_stops_what_frees_the_gpu(harness: Harness) -> None:
    """`stop --all` takes the queued runs out first: stopping the GPU's holder must not let
    the dispatcher start a queued job in between (it did, 1 round in 9)."""
    h = harness
    hold_gpu_0(h, 1)
    start(h, "later", "--queue", "--gpus", "0", secs=0.1)
    res = h.tc("stop", "--all", "--yes", "--json")
    assert res.rc == 0, res
    docs = res.json()
    assert isinstance(docs, list)
    assert (docs[0]["name"], docs[0].get("state")) == ("later", "dequeued")
    assert docs[1]["name"] == "hold"
    assert docs[1]["ok"] is True
    time.sleep(2.5)  # a dispatcher, had one survived, would have started it by now
    assert "later" not in spans(h)


@pytest.mark.parametrize("waits_for", ["gpu", "failed-dependency"])
def test_a_dispatch_that_meets_an_untrusted_state_leaves_it_and_the_entry(
    harness: Harness, waits_for: str
) -> None:
    """The dispatcher never writes a record over a state.json it cannot trust (a start
    that fails on it, a dependency that can never be met): the entry stays queued, with
    the reason, and the file is as it was."""
    h = harness
    hold_gpu_0(h, 1)
    h.tc("start", "--name", "x", "--", "true", check=True)
    h.tc("wait", "x", "--timeout", "30")
    gate = h.tmp / "dep.gate"
    if waits_for == "gpu":
        start(h, "x", "--queue", "--gpus", "0", secs=0.1)
    else:
        start(h, "dep", gate=gate, code=3)
        start(h, "x", "--after", "dep:ok", secs=0.1)
    path = h.home / "jobs" / "x" / "state.json"
    path.write_text('{"schema": 1, "name": "x", "run": "one"}')  # corrupt, by hand
    before = path.read_bytes()
    assert h.tc("stop", "hold").rc == 0  # GPU 0 is free
    gate.touch()  # dep fails: x's dependency can never be met
    said = h.home / "queue" / "waits.said"  # the dispatcher's word on each entry
    wait_for(lambda: said.exists() and "cannot be dispatched" in said.read_text(), 20, "it")
    if waits_for == "gpu":
        assert "cannot be dispatched" in h.tc("queue").out
    assert path.read_bytes() == before  # never written over
    assert (h.home / "queue" / "x.json").exists()  # still queued
    assert "x" not in spans(h)
    one_line_error(h.tc("stop", "x"), 4, "refusing to act on it")  # untrusted: untouched
    assert h.tc("rm", "--force", "x").rc == 0  # what the user does with an untrusted job
    assert not (h.home / "queue" / "x.json").exists()


def test_a_name_queued_again_right_after_its_stop_keeps_a_waiter(harness: Harness) -> None:
    """The old entry's waiter holds the name's lock until its next look (once a second):
    the new entry's waiter waits for it instead of exiting with nothing left to dispatch."""
    h = harness
    hold_gpu_0(h, 1)
    start(h, "first", "--queue", "--gpus", "0", secs=0.1)  # its waiter is the dispatcher
    wait_for((h.home / "queue" / "first.lock").exists, 10, "the dispatcher")
    start(h, "later", "--queue", "--gpus", "0", secs=0.1)  # a waiter that looks once a second
    wait_for((h.home / "queue" / "later.lock").exists, 10, "the first waiter")
    old = _waiter(h, "later")
    assert h.tc("stop", "later").rc == 0  # dequeued
    start(h, "later", "--queue", "--gpus", "0", secs=0.1)  # at once
    wait_for(lambda: not alive(*old), 10, "the old waiter to leave")
    wait_for(lambda: _waiter(h, "later") != old, 10, "the new waiter")
    status = h.tc("status", "later", "--json").json()
    assert isinstance(status, dict)
    assert status["queue"]["waiter_alive"] is True
    assert h.tc("stop", "hold").rc == 0
    assert h.tc("wait", "later", "--timeout", "30").rc == 0
    assert ended(h, "later")
    assert ended(h, "first")


def test_wait_of_a_queued_job_without_a_waiter_says_so(harness: Harness) -> None:
    h = harness
    hold_gpu_0(h, 1)
    start(h, "b", "--queue", "--gpus", "0", secs=0.1)
    wait_for((h.home / "queue" / "b.lock").exists, 10, "b's waiter")
    pid, start_ticks = _waiter(h, "b")
    kill_verified(pid, start_ticks)
    wait_for(lambda: not alive(pid, start_ticks), 10, "the waiter killed")
    t0 = time.monotonic()
    res = h.tc("wait", "b", "--timeout", "60")
    one_line_error(res, 1, "has no waiter: nothing will dispatch it")
    assert time.monotonic() - t0 < 30  # said, not a silent wait to the timeout
    assert "queue resume" in res.err
    assert h.tc("stop", "b").rc == 0  # dequeued
    assert h.tc("stop", "hold").rc == 0
