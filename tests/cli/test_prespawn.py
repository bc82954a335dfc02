"""`trainctl start` forks the job's supervisor as the command begins (launcher/prespawn.py)
and hands it the spec once the CLI has one: the supervisor imports on the other core while
the CLI validates.

What must hold: the supervisor handed the spec is detached exactly as the launch's own
spawn makes it; a start that is refused, or that does not use it, leaves no supervisor
behind and changes nothing; and only a start that names its job plainly spawns one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from trainctl.launcher import prespawn
from trainctl.supervisor.model import layout


def _supervisors(h: Harness, name: str) -> set[int]:
    """Live processes whose command line is this test's supervisor of ``name`` (the home is
    this test's own temporary directory: the marker; nothing here is signalled)."""
    want = [os.fsencode(a) for a in layout.supervisor_args(str(h.home), name)]
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            zombie = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and any(argv[i : i + len(want)] == want for i in range(len(argv))):
            found.add(int(entry))
    return found


def _target(pid: int, fd: str) -> str | None:
    """What fd ``fd`` of ``pid`` is open on; None when it closed since the listing (the
    supervisor opens and closes files as it looks: a race under load)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except FileNotFoundError:
        return None


def test_the_supervisor_spawned_first_runs_the_job_detached(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "early", "--", "sleep", "600", check=True)
    [started] = h.events("early", "started")
    assert started["prespawned"] is True
    pid = h.state("early")["supervisor"]["pid"]
    assert _supervisors(h, "early") == {pid}
    # as the launch's Popen makes it: its own session, cwd /, stdio on /dev/null
    assert os.getsid(pid) == pid
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"

    # and nothing of the CLI's but the handshake, which the supervisor closed. A pipe
    # may be open a moment: the supervisor's own (a `git` it runs for the code record,
    # capturing its output; seen in a loaded CI run); one of the CLI's would stay.
    def pipes() -> list[str]:
        fds = os.listdir(f"/proc/{pid}/fd")
        return [t for fd in fds if (t := _target(pid, fd)) and t.startswith("pipe:")]

    wait_for(lambda: not pipes(), 10, "no pipe open in the supervisor (one of the CLI's stays)")
    stopped = h.tc("stop", "early", "--json", check=True).json()
    assert stopped["ok"] is True  # type: ignore[index]


def test_without_the_early_path_the_supervisor_is_spawned_after(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "late", "--", "sleep", "600",
         env={**h.env, "TRAINCTL_NO_EARLY": "1"}, check=True)  # fmt: skip
    [started] = h.events("late", "started")
    assert started["prespawned"] is False
    h.tc("stop", "late", check=True)


@pytest.mark.parametrize(
    "argv",
    [
        ["start", "--name", "twice", "--", "sleep", "600"],  # the job is running already
        ["start", "--name", "fresh", "--no-such-option", "--", "true"],  # click refuses
        ["start", "--name", "fresh", "--grace", "soon", "--", "true"],  # a bad value
        ["start", "--name", "fresh", "--", "/no/such/program"],  # the start's own refusal
    ],
    ids=["running", "unknown-option", "bad-value", "no-program"],
)
def test_a_refused_start_leaves_no_supervisor_and_changes_nothing(
    harness: Harness, argv: list[str]
) -> None:
    h = harness
    h.tc("start", "--name", "twice", "--", "sleep", "600", check=True)
    live = h.state("twice")["supervisor"]["pid"]
    before = sorted(p.name for p in (h.home / "jobs").iterdir())
    keys = ("run", "marker", "phase", "supervisor", "main", "started_at")
    state_before = {k: h.state("twice")[k] for k in keys}  # the supervisor updates the rest
    res = h.tc(*argv)
    assert res.rc != 0, res.out
    assert len(res.err.strip().splitlines()) == 1, res.err
    name = argv[2]
    wait_for(lambda: _supervisors(h, name) <= {live}, 10, "the unused supervisor to exit")
    assert sorted(p.name for p in (h.home / "jobs").iterdir()) == before
    assert {k: h.state("twice")[k] for k in keys} == state_before
    assert len(h.events("twice", "started")) == 1
    h.tc("stop", "twice", check=True)


def test_a_start_it_was_not_spawned_for_spawns_its_own(harness: Harness) -> None:
    """The job's name comes from the spec file here, not the command line: nothing is
    spawned first, and the launch spawns the supervisor as before."""
    h = harness
    spec = h.tmp / "job.toml"
    spec.write_text('name = "filed"\nargv = ["sleep", "600"]\n')
    h.tc("start", "--spec", str(spec), check=True)
    [started] = h.events("filed", "started")
    assert started["prespawned"] is False
    h.tc("stop", "filed", check=True)


def test_an_unused_supervisor_exits_quietly(harness: Harness) -> None:
    """The CLI gone before it sent anything: the supervisor exits 0 having made nothing
    (not even the job's directory)."""
    h = harness
    t0 = time.monotonic()
    res = h.tc("start", "--name", "gone", "--help")  # help: nothing spawned
    assert res.rc == 0
    assert "Usage" in res.out
    res = h.tc("start", "--name", "gone", "--bogus", "--", "true")
    assert res.rc != 0
    wait_for(lambda: not _supervisors(h, "gone"), 10, "the unused supervisor to exit")
    assert not (h.home / "jobs" / "gone").exists()
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    ("rest", "name"),
    [
        (["start", "--name", "a", "--", "x"], "a"),
        (["start", "--name=b", "--gpus", "1", "--", "x"], "b"),
        (["start", "--name", "a", "--name", "c", "--", "x"], "c"),  # click takes the last
        (["start", "--backend", "local", "--name", "d", "--", "x"], "d"),
        (["start", "--", "--name", "e"], None),  # the job's own argument
        (["start", "--name", "a", "--backend", "slurm", "--", "x"], None),
        (["start", "--name", "a", "--backend=slurm", "--", "x"], None),
        (["start", "--name", "a", "--help"], None),
        (["start", "--name", "a", "--after", "b", "--", "x"], None),  # queued: its waiter's
        (["start", "--after=b:ok", "--name", "a", "--", "x"], None),
        (["start", "--name", "../x", "--", "x"], None),  # not a job name: the verb says so
        (["start", "--name"], None),
        (["status", "--name", "a"], None),
        (["start", "sleep", "1"], None),  # no name: the verb makes one
    ],
)
def test_which_starts_spawn_first(rest: list[str], name: str | None) -> None:
    assert prespawn.named(rest) == name
