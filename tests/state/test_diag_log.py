"""The supervisor's own diagnostic log (issue 55 §6): structlog JSON lines in
``logs/supervisor.jsonl``, bound to the job and the run, apart from events.jsonl (the
job's typed record, which keeps every event it had)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for


def diag_lines(h: Harness, name: str) -> list[dict]:  # type: ignore[type-arg]
    path = h.home / "jobs" / name / "logs" / "supervisor.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_supervisors_diagnostics_are_json_lines_bound_to_the_job_and_run(
    harness: Harness,
) -> None:
    h = harness
    fail = "import sys, time; time.sleep(1); sys.exit(3)"
    h.tc("start", "--name", "dg", "--set", "restart=on-failure", "--set", "max_restarts=1",
         "--set", "restart_backoff=0.1s", "--", sys.executable, "-c", fail, check=True)  # fmt: skip
    wait_for(lambda: h.state("dg")["phase"] == "failed", 30, "both runs to fail")
    sup = h.state("dg")["supervisor"]["pid"]
    wait_for(lambda: not Path(f"/proc/{sup}").exists(), 10, "the last supervisor's exit")
    lines = diag_lines(h, "dg")
    started = [x for x in lines if x["event"] == "supervisor_started"]
    assert [(x["run"], x["job"], x["level"]) for x in started] == [(1, "dg", "info"),
                                                                  (2, "dg", "info")]  # fmt: skip
    assert all(isinstance(x["ts"], float) and x["pid"] > 0 for x in lines)
    # the collector was off while the supervisor's modules loaded, and is back on, what
    # they made frozen (supervisor/__main__.py, boot.py)
    assert all(x["gc_on"] is True and x["gc_frozen"] > 10_000 for x in started), started
    assert "debug" not in {x["level"] for x in lines}  # only when asked (below)
    # the job's record is where it was (a warning is in both: test_checkpoint_guard.py)
    kinds = [e["event"] for e in h.events("dg")]
    assert kinds.count("started") == 2
    assert "reaped" not in kinds
    assert "supervisor_started" not in kinds  # a diagnostic, not a record of the job


def test_debug_lines_are_kept_only_when_asked(harness: Harness) -> None:
    h = harness
    # a grandchild orphaned to the supervisor (its parent exits at once) ends by itself
    # while main still runs: the supervisor reaps it, a debug line
    script = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(0.2); os._exit(0)\n"
        "    os._exit(0)\n"
        "time.sleep(1.5)\n"
    )
    env = {**h.env, "TRAINCTL_SUPERVISOR_DEBUG": "1"}
    h.tc("start", "--name", "dbg", "--", sys.executable, "-c", script, env=env, check=True)
    wait_for(lambda: h.state("dbg")["phase"] == "exited", 30, "the run's end")
    sup = h.state("dbg")["supervisor"]["pid"]
    wait_for(lambda: not Path(f"/proc/{sup}").exists(), 10, "the supervisor's exit")
    reaped = [x for x in diag_lines(h, "dbg") if x["event"] == "reaped"]
    assert reaped, diag_lines(h, "dbg")
    assert {x["level"] for x in reaped} == {"debug"}


def test_the_diag_log_loads_no_console_helpers_even_where_rich_is_installed(
    tmp_path: Path,
) -> None:
    """structlog's dev helpers import rich (and pygments, attrs) when it is installed:
    ~30 ms of CPU in every run's start, on the cores the job starts on. The supervisor's
    logger hides them, and still writes its lines and an exception's traceback."""
    if importlib.util.find_spec("rich") is None:
        pytest.skip("rich is not installed here: nothing to hide")  # the test venv has it
    jdir = tmp_path / "jobs" / "j"
    (jdir / "logs").mkdir(parents=True)
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trainctl.supervisor.diag import open_diag\n"
        f"log = open_diag(Path({str(jdir)!r}), 'j', 1)\n"
        "try:\n"
        "    raise ValueError('boom')\n"
        "except ValueError:\n"
        "    log.error('failed', exc_info=True)\n"
        "loaded = [m for m in ('rich', 'pygments', 'attr') if sys.modules.get(m) is not None]\n"
        "print(','.join(loaded) or 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()  # fmt: skip
    assert out == "none"
    line = json.loads((jdir / "logs" / "supervisor.jsonl").read_text().splitlines()[-1])
    assert line["event"] == "failed"
    assert "ValueError: boom" in line["exception"]
