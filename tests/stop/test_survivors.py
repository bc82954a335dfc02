"""A process that cannot die: stop must say so truthfully, and restart must refuse."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Harness, wait_for


def test_unkillable_survivor_is_named_and_blocks_restart(
    harness: Harness, v1_freezer: Path
) -> None:
    h = harness
    Path(h.env["TRAINCTL_CONFIG"]).write_text("[stop]\nkill_wait_s = 0.5\n")
    h.tc("start", "--name", "fz", "--grace", "0.2", "--", "sleep", "600", check=True)
    main = h.state("fz")["main"]["pid"]
    (v1_freezer / "cgroup.procs").write_text(str(main))
    (v1_freezer / "freezer.state").write_text("FROZEN")
    wait_for(lambda: (v1_freezer / "freezer.state").read_text().strip() == "FROZEN")
    res = h.tc("stop", "fz", "--json")
    assert res.rc == 1
    doc = res.json()
    assert isinstance(doc, dict)
    assert doc["ok"] is False
    [survivor] = doc["report"]["survivors"]
    assert survivor["pid"] == main
    assert survivor["state"] == "D"
    assert "sleep 600" in survivor["cmd"]
    human = h.tc("stop", "fz")
    assert human.rc == 1
    assert f"SURVIVOR   pid {main} state D" in human.out
    refused = h.tc("restart", "fz")
    assert refused.rc == 1
    assert "survived" in refused.err
    assert h.state("fz")["run"] == 1
    (v1_freezer / "freezer.state").write_text("THAWED")  # the pending SIGKILL lands now
    wait_for(lambda: not h.job_pids("fz"), what="survivor to die once thawed")
    again = h.tc("stop", "fz")
    assert again.rc == 0
    assert h.tc("status", "fz", "--json").json()["last_stop"]["ok"] is True  # type: ignore[index]
