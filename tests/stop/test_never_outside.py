"""Property: whatever state.json says, `trainctl stop` never signals a process outside the
job, and never ends in an internal error (exit 70).

Hypothesis mutates a real job's state document towards bystanders (real processes in
their own session, started by this test): their pids with a wrong start time, their
process group and session numbers, their cgroup or other cgroup paths, their parent as
the "supervisor" (exactly, by start time too), members lists, markers, boot ids, with
bystanders started both before and after the job. Only a member named exactly, by pid
*and* start time, is the job's by the file's word; no mutation here names one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Harness, _stat, alive, kill_verified, wait_for

pytestmark = pytest.mark.slow


def _ident(pid: int) -> dict[str, int]:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    return {
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "start": int(fields[19]),
    }


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return "/"


@st.composite
def _forged(draw: st.DrawFn, base: dict[str, Any], victims: list[int]) -> dict[str, Any]:
    doc = json.loads(json.dumps(base))

    def pick() -> int:  # by index: the victims' pids differ from one example to the next
        return victims[draw(st.integers(0, 63)) % len(victims)]

    pid = pick()
    who = _ident(pid)
    off_start = who["start"] + draw(st.integers(1, 10**6)) * draw(st.sampled_from([1, -1]))
    wrong_ref = {"pid": pid, "start_ticks": max(0, off_start)}
    doc["phase"] = draw(st.sampled_from(["running", "starting", "stopping"]))
    if draw(st.booleans()):
        doc["main"] = wrong_ref
    if draw(st.booleans()):
        doc["pgid"] = who["pgid"]
    if draw(st.booleans()):
        doc["sid"] = who["sid"]
    if draw(st.booleans()):  # the victim's parent (this test), by its exact start time too
        parent = who["ppid"]
        exact = _ident(parent)["start"]
        doc["supervisor"] = {
            "pid": parent,
            "start_ticks": draw(st.sampled_from([exact, exact + 7])),
        }
    if draw(st.booleans()):
        members = []
        for victim in [pick() for _ in range(draw(st.integers(0, 4)))]:
            v = _ident(victim)
            members.append(
                {
                    "pid": victim,
                    "start_ticks": v["start"] + draw(st.integers(1, 1000)),
                    "ppid": v["ppid"],
                    "pgid": v["pgid"],
                    "sid": v["sid"],
                    "cmd": "x",
                    "nets": ["main"],
                }
            )
        doc["members"] = members
    if draw(st.booleans()):
        root = (
            "/sys/fs/cgroup/unified"
            if Path("/sys/fs/cgroup/unified").is_dir()
            else "/sys/fs/cgroup"
        )
        doc["cgroup"] = draw(
            st.sampled_from(
                [
                    root,
                    root + _cgroup_of(pid),
                    root + "/../..",
                    "/",
                    "/proc/self",
                    root + "/trainctl/../",
                    root + "/trainctl/not-ours",
                ]
            )
        )
    if draw(st.booleans()):
        doc["marker"] = draw(st.sampled_from(["0" * 32, "a" * 16, doc["marker"][::-1]]))
    if draw(st.booleans()):
        doc["boot_id"] = draw(st.sampled_from([None, "00000000-0000-0000-0000-000000000000"]))
    return doc


def test_no_state_document_gets_a_bystander_signalled(harness: Harness) -> None:
    h = harness
    early = h.bystander("fanout.py", "3", "3")  # its own session, with children, older than any job
    runs = iter(range(1000))

    @settings(
        max_examples=int(os.environ.get("TCTEST_FUZZ_EXAMPLES", "12")),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        # a live job whose supervisor is gone: the CLI's own stop then acts on the file
        name = f"p{next(runs)}"
        h.start_tree(name, "forker.py", grace=0.3)
        real = h.state(name)
        path = h.home / "jobs" / name / "state.json"
        tmp = path.with_name(".forged")
        late: subprocess.Popen[bytes] | None = None
        # Everything after the start sits in the try: Hypothesis may abandon an example at
        # any draw (a buffer overrun raises its internal StopTest), and the job must still
        # be stopped then, or its tree outlives the test.
        try:
            sup = real["supervisor"]
            kill_verified(sup["pid"], sup["start_ticks"])  # ours: started by this test
            wait_for(lambda: not alive(sup["pid"], sup["start_ticks"]), what="supervisor death")
            # bystanders born after the job: the start-time floor does not protect them
            late = h.bystander("fanout.py", "3", "3")
            victims = [p for by in (early, late) for p in (by.pid, *_children(by.pid))]
            before = {v: _ident(v)["start"] for v in victims}
            doc = data.draw(_forged(real, victims))
            tmp.write_text(json.dumps(doc))
            tmp.chmod(0o600)
            tmp.replace(path)
            res = h.tc("stop", name, "--grace", "0.3", "--json")
            assert res.rc != 70, res
            assert "Traceback" not in res.err
            for victim, start in before.items():
                now = _stat(victim)
                assert now is not None, f"bystander {victim} is gone: {doc}"
                assert now[1] == start, f"bystander {victim} is gone: {doc}"
                assert now[0] not in ("T", "Z"), f"bystander {victim} left {now[0]}: {doc}"
        finally:  # whatever the forged file hid from trainctl, the real one stops
            tmp.write_text(json.dumps(real))
            tmp.chmod(0o600)
            tmp.replace(path)
            assert h.tc("stop", name, "--grace", "0.3").rc == 0
            assert not h.job_pids(name)
            if late is not None:
                if late.poll() is None:
                    late.kill()  # ours (Popen handle), and it has done its part
                late.wait()
                h.bystanders.remove(late)

    check()
    h.assert_bystanders_alive()
