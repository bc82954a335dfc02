"""A job's supervisor is the subreaper its orphans exit to: its stop reaps each of them the
moment its pidfd says it exited (terminate._Tracker), not at the event loop's next reaper
batch. Until then a zombie still answers `kill -0 -PGID` and shows in `ps`: the bench's
end-to-end stop measured 13 ms of that lag after the last exit.

The stop runs in a child process of the test that plays the supervisor (a subreaper with
the tree below it), so nothing here changes the test process's own reaping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FANOUT = Path(__file__).resolve().parents[1] / "trees" / "fanout.py"

STOPPER = r"""
import json, os, subprocess, sys, time
from trainctl.supervisor.boot import set_subreaper
from trainctl.supervisor.linux import procfs
from trainctl.supervisor.model.procs import ProcRef
from trainctl.supervisor.model.spec import StopPolicy
from trainctl.supervisor.tree.proctree import Target
from trainctl.supervisor.tree.terminate import stop_tree

fanout, marker, ready, as_supervisor = sys.argv[1:5]
assert set_subreaper()
main = subprocess.Popen(
    [sys.executable, fanout, "6", "4"],
    env={**os.environ, "TRAINCTL_JOB": marker, "TREE_READY": ready},
    start_new_session=True,
)
deadline = time.monotonic() + 30
while not os.path.exists(ready):
    assert time.monotonic() < deadline, "the tree never got ready"
    time.sleep(0.01)


def ref(pid):
    return ProcRef(pid, procfs.read_stat(pid).start_ticks)


me = ref(os.getpid())
target = Target(
    marker=marker,
    main=ref(main.pid),
    supervisor=me if as_supervisor == "yes" else None,
    pgid=main.pid,
    sid=main.pid,
)
report = stop_tree(target, StopPolicy(grace_s=10.0))
zombies = sorted(
    pid for pid in procfs.children(os.getpid())
    if (st := procfs.read_stat(pid)) is not None and st.state == "Z"
)
print(json.dumps({
    "ok": report.ok, "found": report.found, "main": main.pid, "zombies": zombies,
    "main_returncode": main.wait(timeout=10),
}))
while True:  # reap what is left before leaving (as the supervisor's own reaper would)
    try:
        if os.waitpid(-1, 0)[0] == 0:
            break
    except ChildProcessError:
        break
"""


def _stop_as(tmp_path: Path, as_supervisor: str) -> dict[str, object]:
    ready = tmp_path / f"ready-{as_supervisor}"
    marker = f"reap-{as_supervisor}-{tmp_path.name}"
    res = subprocess.run(
        [sys.executable, "-c", STOPPER, str(FANOUT), marker, str(ready), as_supervisor],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("as_supervisor", ["yes", "no"])
def test_the_stop_reaps_the_orphans_of_its_own_job_and_never_main(
    tmp_path: Path, as_supervisor: str
) -> None:
    doc = _stop_as(tmp_path, as_supervisor)
    assert doc["ok"] is True
    assert doc["found"] == 11  # main, 6 children, a chain of 4
    # main's exit status is its owner's to read (the supervisor records it): never reaped
    assert doc["main_returncode"] == -15
    zombies = doc["zombies"]
    assert isinstance(zombies, list)
    if as_supervisor == "yes":
        # every orphan was reaped by the stop itself; only main may wait for its owner
        assert set(zombies) <= {doc["main"]}, zombies
    else:
        # a stop run by anyone else (the CLI after a lost supervisor, a Slurm node agent)
        # reaps nobody: the orphans here are the calling process's to reap, and they wait
        assert len(set(zombies) - {doc["main"]}) >= 6, zombies
