"""Paths and words a new user tripped on (issue 44 §10)."""

from __future__ import annotations

from tests.conftest import Harness
from trainctl.launcher import render
from trainctl.launcher.inputs import human_duration
from trainctl.launcher.results import Progress


def test_progress_past_its_total_says_so_and_shows_no_eta() -> None:
    line = render.progress_line(Progress(step=115, total_steps=100, steps_per_s=2.0, eta_s=0.0))
    assert "115/100 (past total)" in line
    assert "%" not in line
    assert "ETA" not in line
    line = render.progress_line(Progress(step=50, total_steps=100, steps_per_s=2.0, eta_s=25.0))
    assert "50/100 (50%)" in line
    assert "ETA 25" in line


def test_durations_are_rounded_as_people_read_them() -> None:
    assert human_duration(0.999903) == "1s"
    assert human_duration(12.3456) == "12.3s"
    assert human_duration(59.99) == "1m"
    assert human_duration(0.25) == "0.25s"


def test_wait_timeout_says_a_round_duration(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "w", "--", "sleep", "600", check=True)
    res = h.tc("wait", "w", "--timeout", "1")
    assert res.rc == 124
    assert "still running after 1s" in res.err, res.err
    h.tc("stop", "w", check=True)


def test_stop_help_says_durations() -> None:
    from click.testing import CliRunner  # noqa: PLC0415  (only this test)

    from trainctl.launcher.cli import cli  # noqa: PLC0415  (only this test)

    out = CliRunner().invoke(cli, ["stop", "--help"]).output
    assert "--grace DURATION" in out
    assert "SECONDS" not in out
