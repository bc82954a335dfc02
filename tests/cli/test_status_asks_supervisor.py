"""`trainctl status NAME [--json]` asks the job's live supervisor for its members before
the status code is imported (launcher/early.py, ``{"op": "members"}``), and shows what
the supervisor's roster holds instead of reading every process of the job again.

The answer must be the count the CLI's own scan gives, escaped processes included; any
other shape of the command asks nothing; a reply that is not a count is not used.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from tests.helpers import frozen_supervisor
from trainctl.launcher import early
from trainctl.launcher.ops.status import job_status
from trainctl.supervisor.model import control
from trainctl.supervisor.model.reports import MembersReply
from trainctl.supervisor.model.schema import build_document

FANOUT = Path(__file__).parents[1] / "trees" / "fanout.py"
# main, then a child that leaves main's tree (setsid + double fork): an escaped member
ESCAPE = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(600)\n"
    "    os._exit(0)\n"
    "time.sleep(600)\n"
)


def _counts(h: Harness, name: str, *, early_too: bool) -> tuple[int, int]:
    env = dict(h.env) if early_too else {**h.env, "TRAINCTL_NO_EARLY": "1"}
    doc = h.tc("status", name, "--json", env=env, check=True).json()
    return doc["members"], doc["escaped"]


def test_the_supervisor_counts_a_big_job_as_the_scan_does(harness: Harness) -> None:
    h = harness
    ready = h.tmp / "fan.ready"
    h.tc(
        "start", "--name", "fan", "--env", f"TREE_READY={ready}",
        "--", sys.executable, str(FANOUT), "40", "8",
        check=True,
    )  # fmt: skip
    wait_for(ready.exists, 30, "the tree")
    h.tc("start", "--name", "esc", "--", sys.executable, "-c", ESCAPE, check=True)
    wait_for(lambda: len(h.job_pids("esc")) == 2, 30, "main and its escaped grandchild")
    for name, want in (("fan", 49), ("esc", 2)):
        asked = _counts(h, name, early_too=True)
        scanned = _counts(h, name, early_too=False)
        assert asked == scanned, (name, asked, scanned)
        assert asked[0] == want == len(h.job_pids(name)), asked
    assert _counts(h, "esc", early_too=True)[1] == 1  # the setsid'd one left main's tree
    h.tc("stop", "fan", check=True)
    h.tc("stop", "esc", check=True)


def test_status_reads_the_answer_the_supervisor_gave(here: Harness) -> None:
    h = here
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    jdir = str(h.home / "jobs" / "e")
    early.send(["status", "e", "--json"])
    s = job_status(h.home, "e")
    assert early.members_answer(jdir) is None  # read by job_status: asked once, used once
    assert (s.members, s.escaped) == (1, 0)
    early.send(["--home", str(h.home), "status", "e"])
    raw = early.members_answer(jdir)
    assert raw is not None
    reply = build_document(MembersReply, json.loads(raw), "reply")
    assert (reply.ok, reply.members, reply.escaped) == (True, 1, 0)
    h.tc("stop", "e", check=True)


def test_the_members_op_is_a_typed_reply_on_the_socket(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    doc = control.request(h.home / "jobs" / "e", {"op": "members"}, 5.0)
    assert doc == {"ok": True, "members": 1, "escaped": 0}
    h.tc("stop", "e", check=True)


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "e", "--wide"],  # a flag only the verb knows
        ["status", "e", "f"],
        ["status", "--json"],
        ["status", "../e"],
        ["--home", "", "status", "e"],
        ["list"],
    ],
)
def test_anything_but_the_plain_shapes_asks_nothing(here: Harness, argv: list[str]) -> None:
    h = here
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    early.send(argv)
    assert early.members_answer(str(h.home / "jobs" / "e")) is None
    h.tc("stop", "e", check=True)


def test_a_mute_supervisor_costs_status_half_a_second_not_its_answer(harness: Harness) -> None:
    """Stopped (SIGSTOP), the supervisor still accepts the connection (the kernel queues
    it) but never answers: status counts the members itself after ANSWER_S."""
    h = harness
    h.tc("start", "--name", "m", "--", "sleep", "600", check=True)
    with frozen_supervisor(h, "m"):
        t0 = time.monotonic()
        doc = h.tc("status", "m", "--json", check=True).json()
        took = time.monotonic() - t0
    assert doc["members"] == 1
    assert early.ANSWER_S <= took < 10, took  # waited for the answer, then counted
    h.tc("stop", "m", check=True)
