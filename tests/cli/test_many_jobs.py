"""Many jobs and finished ones: several names per verb, `stop --all`, `prune`, the order
of `list` and `top`, and numbers that stop being live once a run has ended."""

from __future__ import annotations

import sys
import time

from tests.conftest import TREES, Harness, wait_for


def _names(h: Harness, *args: str) -> list[str]:
    doc = h.tc("list", "--json", *args, check=True).json()
    assert isinstance(doc, list)
    return [r["name"] for r in doc]


def test_stop_several_names_and_all_of_them_then_rm_and_prune(harness: Harness) -> None:
    h = harness
    for name in ("a", "b", "c"):
        h.tc("start", "--name", name, "--", "sleep", "600", check=True)
    h.tc("start", "--name", "done", "--", "true", check=True)
    h.tc("wait", "done", "--timeout", "20", check=True)
    # bad input first: an unknown name among good ones stops nothing
    bad = h.tc("stop", "a", "nope")
    assert (bad.rc, bad.out) == (2, "")
    assert "no job named 'nope'" in bad.err
    assert h.tc("status", "a").rc == 0
    both = h.tc("stop", "a", "b", "--json", check=True).json()
    assert isinstance(both, list)
    assert [(d["name"], d["ok"]) for d in both] == [("a", True), ("b", True)]
    assert h.tc("status", "c").rc == 0  # not named: untouched
    # --all: off a terminal it must be confirmed, and refuses with nothing changed
    refused = h.tc("stop", "--all")
    assert refused.rc == 2
    assert "--yes" in refused.err
    assert h.tc("status", "c").rc == 0
    assert h.tc("stop", "--all", "a").rc == 2
    out = h.tc("stop", "--all", "--yes", check=True).out
    assert "stopped c" in out
    assert not h.job_pids("c")
    assert "nothing to stop" in h.tc("stop", "--all", "--yes", check=True).out
    # live first, then the latest ended first: c ended last
    assert _names(h) == ["c", "b", "a", "done"]
    table = h.tc("list", check=True).out.splitlines()
    assert (
        table[0].split()[-4:] == ["MEMBERS", "TIME", "LAST", "LOG", "LINE"][-4:]
        or "TIME" in table[0]
    )
    assert all("ended" in row and "ago" in row for row in table[1:]), table
    # rm of several; an unknown one among them removes nothing
    assert h.tc("rm", "a", "nope").rc == 2
    assert _names(h) == ["c", "b", "a", "done"]
    h.tc("rm", "a", "b", check=True)
    assert _names(h) == ["c", "done"]
    # prune: only what ended longer ago than asked. The old jobs ended 6 s before fresh,
    # and each cut is taken, just before its prune, 3 s older than fresh's end: a busy
    # machine's slow CLI calls can then neither age fresh past it nor c short of it.
    time.sleep(6)
    h.tc("start", "--name", "fresh", "--", "true", check=True)
    h.tc("wait", "fresh", "--timeout", "20", check=True)

    def cut() -> str:
        return f"{int(time.time() - float(h.state('fresh')['ended_at'])) + 3}s"

    dry = h.tc("prune", "--older-than", cut(), "--dry-run", "--json", check=True).json()
    assert isinstance(dry, dict)
    assert sorted(r["name"] for r in dry["removed"]) == ["c", "done"]
    assert _names(h) == ["fresh", "c", "done"]
    assert h.tc("prune", "--older-than", "soon").rc == 2
    gone = h.tc("prune", "--older-than", cut(), check=True).out
    assert "removed c" in gone
    assert "removed done" in gone
    assert _names(h) == ["fresh"]
    assert "no job" in h.tc("prune", "--older-than", "7d", check=True).out
    h.tc("rm", "fresh", check=True)
    assert h.tc("list", check=True).out.strip() == f"no jobs in {h.home}"


def test_a_finished_run_shows_where_it_stopped_and_when_not_a_rate(harness: Harness) -> None:
    h = harness
    script = h.tmp / "steps.py"
    script.write_text(
        f"import sys, time\nsys.path.insert(0, {str(TREES.parent.parent)!r})\n"
        "from trainctl.launcher import trainer\n"
        "for step in range(1, 10000):\n"
        "    trainer.report(step=step, loss=1.0)\n"
        "    time.sleep(0.01)\n"
    )
    h.tc(
        "start", "--name", "p", "--set", "total_steps=50000", "--", sys.executable, str(script),
        check=True,
    )  # fmt: skip
    wait_for(lambda: "steps/s" in h.tc("status", "p").out, 30, "a live rate")
    h.tc("stop", "p", check=True)
    human = h.tc("status", "p").out
    assert "steps/s" not in human, human
    assert "ETA" not in human
    assert "prog stopped at step " in human, human
    assert "/50000 (" in human
    assert ", ended " in human, human
    assert " ago" in human
    doc = h.tc("status", "p", "--json").json()
    assert isinstance(doc, dict)
    assert doc["progress"]["steps_per_s"] is None
    assert doc["progress"]["eta_s"] is None
    assert doc["progress"]["step"] > 0
    top = h.tc("top", "--once", check=True).out
    assert "stopped at step" in top, top
    assert "steps/s" not in top


def test_top_shows_every_live_job_above_a_few_finished_ones(harness: Harness) -> None:
    h = harness
    for i in range(5):
        h.tc("start", "--name", f"old{i}", "--", "true", check=True)
        h.tc("wait", f"old{i}", "--timeout", "20", check=True)
    h.tc("start", "--name", "zlive", "--", "sleep", "600", check=True)
    lines = h.tc("top", "--once", check=True).out.splitlines()
    rows = [ln for ln in lines if ln.startswith(("old", "zlive"))]
    assert rows[0].startswith("zlive"), lines
    assert len(rows) == 4  # the live one and the 3 latest finished
    assert rows[1].startswith("old4")
    assert any("2 more finished job(s)" in ln for ln in lines), lines
    doc = h.tc("top", "--json", check=True).json()  # every job, live first, and the GPUs
    assert isinstance(doc, dict)
    assert [j["name"] for j in doc["jobs"]] == ["zlive", "old4", "old3", "old2", "old1", "old0"]
    assert doc["jobs"][0]["state"] == "running"
    assert isinstance(doc["gpus"], list)
    assert doc["gpus"] or doc["gpus_error"]
    h.tc("stop", "zlive", check=True)
