"""The traps a newcomer fell into (issue 36 §3), each on real jobs: durations as people
write them, every unknown key at once, name hints, a default name, the dependents a stop
dooms, a run that never ran, and the grace a joined stop really gave."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TRAINCTL, Harness, wait_for
from tests.helpers import one_line_error
from trainctl.launcher.inputs import parse_duration
from trainctl.supervisor.errors import ConfigError

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


@pytest.mark.parametrize(
    ("text", "secs"),
    [
        ("5min", 300.0),
        ("5 minutes", 300.0),
        ("90sec", 90.0),
        ("1h30m", 5400.0),
        ("1h 30min", 5400.0),
        ("2 hours 15 minutes", 8100.0),
        ("1.5d", 129600.0),
        ("3 days", 259200.0),
        ("45 s", 45.0),
        ("2hr", 7200.0),
    ],
)
def test_durations_as_systemd_and_people_write_them(text: str, secs: float) -> None:
    assert parse_duration(text, "--grace") == secs


@pytest.mark.parametrize("text", ["soon", "5ms", "1h1h", "m", "5 parsecs", "1w", "-5s", "h5"])
def test_anything_else_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--grace") as e:
        parse_duration(text, "--grace")
    assert "\n" not in str(e.value)


def test_every_unknown_key_of_a_spec_file_at_once(harness: Harness) -> None:
    h = harness
    spec = h.tmp / "job.toml"
    spec.write_text('name = "x"\ngpu = "0"\nargv = ["true"]\ngrase = 5\nzzzqqq = 1\n')
    res = h.tc("start", "-c", str(spec))
    one_line_error(res, 2, "3 unknown keys")
    assert "gpu (line 2; did you mean gpus?)" in res.err
    assert "grase (line 4; did you mean grace?)" in res.err
    assert "zzzqqq (line 5)" in res.err
    assert not (h.home / "jobs" / "x").exists()


def test_a_misspelt_job_name_gets_a_hint_and_a_start_without_name_gets_one(
    harness: Harness,
) -> None:
    h = harness
    script = h.tmp / "train.py"
    script.write_text("import time\ntime.sleep(60)\n")
    first = h.tc("start", "--", sys.executable, str(script), check=True)
    assert "the job is named train" in first.out
    second = h.tc("start", "--json", "--", sys.executable, str(script), check=True)
    assert second.json()["name"] == "train-2"  # taken: deduplicated
    one_line_error(h.tc("status", "tarin"), 2, "did you mean train?")
    one_line_error(h.tc("status", "zzz"), 2, "no job named 'zzz'")
    assert "did you mean" not in h.tc("status", "zzz").err
    for name in ("train", "train-2"):
        h.tc("stop", name, check=True)


def test_a_stop_names_the_queued_jobs_it_dooms_and_the_one_that_never_ran_says_so(
    harness: Harness,
) -> None:
    h = harness
    h.tc("start", "--name", "a", "--grace", "1", "--", "sleep", "60", check=True)
    h.tc("start", "--name", "next", "--after", "a", "--", "true", check=True)
    h.tc("start", "--name", "any", "--after", "a:any", "--", "true", check=True)
    plan = h.tc("stop", "a", "--dry-run", check=True)
    assert "would fail the queued job(s) waiting for it: next (after a:ok)" in plan.out
    assert "any" not in plan.out.split("waiting for it:")[-1]  # a:any is met by a stop
    assert h.tc("stop", "a", "--dry-run", "--json", check=True).json()["dooms"] == [
        "next (after a:ok)"
    ]
    stop = h.tc("stop", "a", check=True)
    assert "next (after a:ok)" in stop.err
    assert "can no longer start" in stop.err
    wait_for(lambda: h.tc("status", "next").rc == 3, 30, "next to end failed")
    status = h.tc("status", "next").out
    assert "never ran: after a:ok, but a run 1 was stopped" in status
    for absent in ("supervisor", "mode", "log ", "main pid"):
        assert absent not in status, status
    logs = h.tc("logs", "next")
    assert logs.rc == 0
    assert "never ran" in logs.err
    assert h.tc("wait", "any", "--timeout", "30").rc == 0


def test_a_joined_stop_reports_the_grace_that_applied(harness: Harness) -> None:
    h = harness
    h.tc(
        "start", "--name", "slow", "--grace", "20", "--", sys.executable, "-c", IGNORES_TERM,
        check=True,
    )  # fmt: skip
    time.sleep(0.5)
    first = subprocess.Popen(
        [*TRAINCTL, "stop", "slow", "--json"], env=h.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: h.state("slow")["phase"] == "stopping", 20, "the first stop")
    joined = h.tc("stop", "slow", "--grace", "1", "--json", timeout=60)
    out, _ = first.communicate(timeout=60)
    assert joined.rc == 0, joined
    report = joined.json()["report"]
    assert report["grace_s"] < 10  # about the 1 s asked (plus the time before it), not 20
    assert f"after the {report['grace_s']:g} s grace" in report["cause"]["summary"]
    assert "20 s grace" not in h.tc("list").out
    assert Path(h.home / "jobs" / "slow" / "state.json").exists()
    assert '"grace_s": 20' not in out


def test_a_progress_bar_shows_as_its_latest_frame_in_logs_and_status(harness: Harness) -> None:
    h = harness
    bar = "import sys, time\nfor i in range(1, 201):\n    sys.stdout.write(f'\\r{i}/200 it')\n"
    bar += "sys.stdout.write('\\ndone\\n'); sys.stdout.flush(); time.sleep(60)\n"
    h.tc("start", "--name", "bar", "--", sys.executable, "-c", bar, check=True)
    log = h.home / "jobs" / "bar" / "logs" / "run-1.log"
    wait_for(lambda: log.exists() and "done" in log.read_text(), 20, "the bar to finish")
    assert log.read_bytes().count(b"\r") == 200  # the raw file keeps every frame
    out = h.tc("logs", "bar", check=True).out
    assert out == "200/200 it\ndone\n"
    raw = h.tc("logs", "bar", "--raw", check=True).out  # (read in text mode: \r -> \n)
    assert raw.count("/200 it") == 200
    assert "last done" in h.tc("status", "bar", check=True).out
    h.tc("stop", "bar", check=True)
