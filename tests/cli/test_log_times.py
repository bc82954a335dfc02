"""`logs --timestamps` and `--since` (issue 37 §3): the times the supervisor records beside
a real job's log, while the log stays byte for byte the job's own."""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

from tests.conftest import Harness, wait_for
from tests.helpers import one_line_error
from trainctl.supervisor.watch.logtimes import LogStamper, read_stamps, times_path

# prints 'early', waits for the test's gate, prints 'late', then waits to be stopped
GATED = """
import os, sys, time
print("early", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("late", flush=True)
time.sleep(600)
"""


def _times(h: Harness, *extra: str) -> dict[str, str]:
    out = h.tc("logs", "gated", "--timestamps", *extra, check=True).out
    return {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in out.splitlines()}


def _at(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_each_line_has_the_time_it_was_written_and_since_picks_by_it(harness: Harness) -> None:
    h = harness
    gate = h.tmp / "gate"
    h.tc("start", "--name", "gated", "--", sys.executable, "-c", GATED, str(gate), check=True)
    wait_for(lambda: _times(h).get("early", "-") != "-", 20, "the first line's time")
    time.sleep(1.1)  # a gap between the two lines (not a wait for anything)
    between = time.time()
    gate.touch()
    wait_for(lambda: _times(h).get("late", "-") != "-", 20, "the second line's time")
    times = _times(h)
    assert _at(times["early"]) < between < _at(times["late"]), (times, between)
    assert _at(times["late"]) - between < 5  # to within the look's interval (and a busy host)

    since = datetime.datetime.fromtimestamp(between).isoformat()  # local time, as people type
    assert h.tc("logs", "gated", "--since", since, check=True).out == "late\n"
    assert h.tc("logs", "gated", "--since", "1h", check=True).out == "early\nlate\n"
    assert list(_times(h, "-n", "1")) == ["late"]
    doc = h.tc("logs", "gated", "-t", "--json", check=True).json()
    assert isinstance(doc, dict)
    assert doc["lines"] == ["early", "late"]
    assert [round(t, 3) for t in doc["times"]] == [round(_at(times[k]), 3) for k in doc["lines"]]
    log = h.home / "jobs" / "gated" / "logs" / "run-1.log"
    assert log.read_bytes() == b"early\nlate\n"  # the raw log is the job's own bytes
    one_line_error(h.tc("logs", "gated", "--since", "a while"), 2, "--since")
    assert h.tc("stop", "gated").rc == 0


def test_stamps_follow_growth_and_start_again_on_rotation(tmp_path: Path) -> None:
    log = tmp_path / "run-1.log"
    log.write_bytes(b"")
    stamper = LogStamper(log)
    stamper.step(now=10.0)  # nothing written yet: no stamp
    assert not times_path(log).exists()
    log.write_bytes(b"a\nb\n")
    stamper.step(now=11.0)
    stamper.step(now=11.5)  # not grown: no stamp
    with log.open("ab") as f:
        f.write(b"c\n")
    stamper.step(now=12.0)
    stamps = read_stamps(log)
    assert stamps.sizes == (4, 6)
    assert stamps.time_of(2) == 11.0  # 'a' ended at 2: seen at the 11.0 look
    assert stamps.time_of(6) == 12.0
    assert stamps.time_of(7) is None  # written after the last look
    log.write_bytes(b"d\n")  # copytruncate left the log shorter: the times start again
    stamper.step(now=13.0)
    assert read_stamps(log).sizes == (2,)
    assert read_stamps(log).time_of(2) == 13.0
    times_path(log).write_bytes(b"2 13.0\ngarbage\n9 14.0\n12 1")  # a torn line is skipped
    assert read_stamps(log).sizes == (2, 9)
