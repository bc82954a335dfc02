"""runview.TailCache (issue 56 §5): the chart refresh parses each progress file once, then
only what was appended; its points are always those a read of the newest bytes gives."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from trainctl.launcher.ops import runview
from trainctl.launcher.results.ops import ProgressPoint


def line(step: int) -> bytes:
    return json.dumps({"step": step, "loss": 1.0 / step, "t": 1000.0 + step}).encode() + b"\n"


def fresh(path: Path, budget: int, parse: runview.Parse) -> tuple[list[ProgressPoint], int]:
    """What a reader without the cache gets (the CLI's, MCP's)."""
    return runview._newest_points(path, budget, parse)


@pytest.mark.parametrize("budget", [runview.POINTS_BYTES, 5000, 1000, 37, 0])
def test_appended_lines_and_smaller_budgets_read_as_without_the_cache(
    tmp_path: Path, budget: int
) -> None:
    p = tmp_path / "run-1.progress.jsonl"
    p.write_bytes(b"".join(line(i) for i in range(1, 200)))
    cache, parse = runview.TailCache(), runview._json_of(1)
    assert cache.newest(p, budget, parse, "json") == fresh(p, budget, parse)
    with open(p, "ab") as f:
        f.write(line(200) + line(201)[:7])  # the last one still being written
    assert cache.newest(p, budget, parse, "json") == fresh(p, budget, parse)
    with open(p, "ab") as f:
        f.write(line(201)[7:] + b"junk\n" + line(202))
    got = cache.newest(p, budget, parse, "json")
    assert got == fresh(p, budget, parse)
    if budget == runview.POINTS_BYTES:
        assert [pt.step for pt in got[0]][-3:] == [200.0, 201.0, 202.0]


def test_past_the_window_the_oldest_points_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runview, "POINTS_BYTES", 4096)
    p = tmp_path / "p.jsonl"
    p.write_bytes(b"".join(line(i) for i in range(1, 100)))
    cache, parse = runview.TailCache(), runview._json_of(1)
    for more in range(100, 400, 50):  # the window slides over what was read
        assert cache.newest(p, 4096, parse, "json") == fresh(p, 4096, parse)
        with open(p, "ab") as f:
            f.write(b"".join(line(i) for i in range(more, more + 50)))
    assert cache.newest(p, 4096, parse, "json") == fresh(p, 4096, parse)


def test_a_progress_bars_frames_and_a_replaced_log(tmp_path: Path) -> None:
    log = tmp_path / "run-1.log"
    log.write_bytes(b"start\nstep 1/9 loss 0.5\rstep 2/9 loss 0.4\rstep 3/9 loss 0.3\nok\n")
    cache, parse = runview.TailCache(), runview._matched_of(1, re.compile(r"step (?P<step>\d+)"))
    got = cache.newest(log, 1 << 20, parse, "rx")
    assert got == fresh(log, 1 << 20, parse)
    assert [pt.step for pt in got[0]] == [1.0, 2.0, 3.0]  # each frame, as tail_lines splits
    new = tmp_path / "new.log"
    new.write_bytes(b"step 7 x\n" * 40)
    os.replace(new, log)  # another file: read again, not appended to
    assert cache.newest(log, 1 << 20, parse, "rx") == fresh(log, 1 << 20, parse)
    log.write_bytes(b"step 8 y\n")  # shorter than what was read: read again
    assert cache.newest(log, 1 << 20, parse, "rx") == fresh(log, 1 << 20, parse)
    log.unlink()
    assert cache.newest(log, 1 << 20, parse, "rx") == ([], 1 << 20)
    assert not cache._files  # forgotten: a web server outlives removed jobs


def test_a_link_in_place_of_a_progress_file_is_not_followed(tmp_path: Path) -> None:
    """As every reader of a file's end (supervisor/model/tail.py): a job cannot point its
    progress file at another file and have the web server read it out."""
    other = tmp_path / "other.jsonl"
    other.write_bytes(line(1) + line(2))
    p = tmp_path / "run-1.progress.jsonl"
    p.symlink_to(other)
    parse = runview._json_of(1)
    assert runview.TailCache().newest(p, 1 << 20, parse, "json") == ([], 1 << 20)
    assert fresh(p, 1 << 20, parse)[0] == []  # (it counts the target's size against the budget)
