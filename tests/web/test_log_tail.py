"""The web page's log view (`/api/jobs/NAME/log`, runview.log_tail): a first look at the
log's end, then what follows the offset it returned. Polled while a real job writes, the
lines come each once and in order; a progress bar's line longer than one read does not
hold the view at its offset for ever."""

from __future__ import annotations

import sys
import time

from tests.conftest import Harness
from trainctl.launcher.ops import runview


def poll_until_done(h: Harness, name: str, want_last: str) -> list[str]:
    """Every line the page would show, polled as its script does, until ``want_last``."""
    t = runview.log_tail(h.home, name, None)
    lines, offset = list(t.lines), t.offset
    deadline = time.monotonic() + 60  # generous: a hang, not a speed target
    while want_last not in lines and time.monotonic() < deadline:
        t = runview.log_tail(h.home, name, offset)
        lines += t.lines
        offset = t.offset
        time.sleep(0.001)
    return lines


def test_polling_a_job_that_writes_all_the_time_repeats_and_loses_no_line(
    harness: Harness,
) -> None:
    h = harness
    n = 4000
    code = f"import time\nfor i in range({n}):\n    print(i, flush=True)\n    time.sleep(0.0005)\n"
    h.tc("start", "--name", "many", "--", sys.executable, "-c", code, check=True)
    time.sleep(0.3)  # a first look well into its lines
    got = [int(x) for x in poll_until_done(h, "many", str(n - 1))]
    assert got == list(range(got[0], n)), (got[:8], len(got))


def test_a_progress_bar_longer_than_one_read_does_not_stall_the_view(harness: Harness) -> None:
    h = harness
    frames = runview.TAIL_BYTES // 40 + 500  # ~1.3 reads' worth of \r frames, no newline
    code = (
        "import sys, time\n"
        "print('before', flush=True)\n"
        "time.sleep(0.5)\n"
        f"for i in range({frames}):\n"
        "    sys.stdout.write(f'\\rstep {i:8d} of many ' + 'x' * 16)\n"
        "sys.stdout.write('\\n'); print('after', flush=True)\n"
        "time.sleep(600)\n"
    )
    h.tc("start", "--name", "bar", "--", sys.executable, "-c", code, check=True)
    try:
        deadline = time.monotonic() + 30
        while runview.log_tail(h.home, "bar", None).lines != ["before"]:
            assert time.monotonic() < deadline, runview.log_tail(h.home, "bar", None)
            time.sleep(0.05)
        lines = poll_until_done(h, "bar", "after")
        assert lines[-2:] == [f"step {frames - 1:8d} of many " + "x" * 16, "after"], lines[-3:]
    finally:
        h.tc("stop", "bar", check=True)


def test_an_unfinished_line_comes_as_the_partial_each_look_then_as_a_line(
    harness: Harness,
) -> None:
    """A progress bar between newlines: its latest frame, each look, in place (`partial`),
    never among the lines until its newline comes."""
    h = harness
    gate = h.tmp / "gate"
    code = (
        "import os, sys, time\n"
        "print('before', flush=True)\n"
        "for i in range(3):\n"
        "    sys.stdout.write(f'\\repoch 1: {i}/3'); sys.stdout.flush()\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.02)\n"
        "print(' done', flush=True)\n"
        "time.sleep(600)\n"
    )
    h.tc("start", "--name", "pb", "--", sys.executable, "-c", code, check=True)
    try:
        deadline = time.monotonic() + 30
        while (first := runview.log_tail(h.home, "pb", None)).partial != "epoch 1: 2/3":
            assert time.monotonic() < deadline, first
            time.sleep(0.05)
        assert first.lines == ["before"]
        again = runview.log_tail(h.home, "pb", first.offset)
        assert (again.lines, again.partial, again.offset) == ([], "epoch 1: 2/3", first.offset)
        gate.touch()
        while not (t := runview.log_tail(h.home, "pb", first.offset)).lines:
            assert time.monotonic() < deadline, t
            time.sleep(0.05)
        assert (t.lines, t.partial) == (["epoch 1: 2/3 done"], "")
    finally:
        h.tc("stop", "pb", check=True)
