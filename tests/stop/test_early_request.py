"""A plain `trainctl stop NAME` sends its request before the verb is imported
(launcher/early.py): to the job's own supervisor only, once, and read by the verb."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Harness, wait_for
from trainctl.launcher import early
from trainctl.launcher.verbs import stop as stop_verb
from trainctl.supervisor.errors import ConfigError
from trainctl.supervisor.model import control


def test_a_plain_stop_goes_out_first_and_the_verb_reads_its_answer(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    res = h.tc("stop", "e", "--grace", "5", "--order", "all", "--json", check=True)
    doc = res.json()
    assert doc["via"] == "supervisor"
    assert doc["ok"] is True
    assert doc["warnings"] == []  # not "joined": one request, not the early one and another
    assert "ran" not in res.err  # the verb read the answer itself
    stopping = h.events("e", "stopping")
    assert len(stopping) == 1, stopping
    assert stopping[0]["grace_s"] == 5.0  # what was asked, as the verb would have asked it
    assert stopping[0]["order"] == "all"


def test_the_early_stop_reads_the_grace_by_the_verbs_own_grammar(here: Harness) -> None:
    """issue 55 §4: one grammar of a duration (launcher/durations.py). `--grace 1m30s`
    used to go through the verb only (early.py knew 90 and 90s); it goes out first now,
    as the same 90 s the verb would have asked for."""
    h = here
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    jdir = str(h.home / "jobs" / "e")
    early.send_stop(["stop", "e", "--grace", "1m30s"])
    assert early.pending(jdir)
    sock = early.claim(jdir, None, 90.0)  # the verb's own reading of "1m30s"
    assert sock is not None
    sock.close()
    wait_for(lambda: not h.job_pids("e"), what="the job stopped by the early request")
    (stopping,) = h.events("e", "stopping")
    assert stopping["grace_s"] == 90.0


def test_the_request_is_sent_to_a_live_supervisor_and_claimed_once(here: Harness) -> None:
    h = here
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    jdir = str(h.home / "jobs" / "e")
    early.send_stop(["stop", "e", "--grace", "2.5"])
    assert early.pending(jdir)
    wait_for(lambda: not h.job_pids("e"), what="the job stopped by the early request alone")
    assert early.claim(jdir, "tree", 2.5) is None  # asked something else: closed, not reused
    assert not early.pending(jdir)


def test_an_answer_nobody_claimed_is_waited_for_and_said(
    here: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    """The verb failed before it read the answer: the entry still waits for the stop."""
    h = here
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    early.send_stop(["stop", "e"])
    stop_verb.note_unclaimed(wait=True)
    assert "the stop sent to e's supervisor ran: nothing of it is left" in capsys.readouterr().err
    assert not h.job_pids("e")


@pytest.mark.parametrize(
    "argv",
    [
        ["stop", "e", "--gpu-timeout", "5"],  # a flag only the verb reads
        ["stop", "e", "--grace", "soon"],  # not a duration: the verb says so
        ["stop", "e", "--grace", "2y"],  # nor this
        ["stop", "e", "--main-only", "--order", "all"],  # a contradiction: the verb says so
        ["stop", "e", "--grace", "0"],
        ["stop", "--all"],
        ["stop", "e", "f"],
        ["stop", "../e"],
        ["status", "e"],
    ],
)
def test_anything_but_the_plain_shapes_sends_nothing(here: Harness, argv: list[str]) -> None:
    here.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    early.send_stop(argv)
    assert early.unclaimed() == []
    assert here.job_pids("e")
    here.tc("stop", "e", check=True)


def test_a_queued_run_of_the_name_sends_nothing(here: Harness) -> None:
    """The verb dequeues it first, so that the stop cannot free GPUs for it."""
    h = here
    h.tc("start", "--name", "e", "--", "sleep", "600", check=True)
    (h.home / "queue").mkdir(exist_ok=True)
    (h.home / "queue" / "e.json").write_text("{}")
    early.send_stop(["stop", "e"])
    assert early.unclaimed() == []
    (h.home / "queue" / "e.json").unlink()
    h.tc("stop", "e", check=True)


LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(1)
print("ready", flush=True)
conn, _ = s.accept()
conn.settimeout(5)
got = b""
try:
    while chunk := conn.recv(4096):
        got += chunk
except OSError:
    pass
print(repr(got), flush=True)
"""


def test_a_socket_served_by_anything_but_the_jobs_supervisor_gets_nothing(
    here: Harness,
) -> None:
    """Our own uid is not enough: the peer must be `python -m trainctl.supervisor` for
    this home and name (a planted listener, here, is not)."""
    jdir = here.home / "jobs" / "e"
    jdir.mkdir(parents=True, mode=0o700)
    sock = jdir / control.SOCK_NAME
    env = {**here.env}
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(sock)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        early.send_stop(["stop", "e"])
        assert early.unclaimed() == []
        assert proc.stdout.readline().strip() == "b''"  # connected, checked, sent nothing
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_module_reads_the_home_as_the_cli_does(
    here: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert early.home_of("rel/./h//") == f"{tmp_path}/rel/h"
    monkeypatch.delenv("TRAINCTL_HOME")
    monkeypatch.setenv("TRAINCTL_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "st"))
    assert early.home_of(None) == f"{tmp_path}/st/trainctl"
    (tmp_path / "none.toml").write_text("[state]\nhome = '/elsewhere'\n")
    assert early.home_of(None) is None  # the config decides: the verb reads it


def test_its_paths_are_the_ones_the_rest_of_trainctl_uses(tmp_path: Path) -> None:
    """early.py takes the job, socket and queue paths, the name rule and the supervisor's
    command line from supervisor/model/layout.py (plain strings, importing nothing), as
    the verb, the supervisor and the queue do: the same paths through either."""
    from trainctl.launcher.ops import queue  # noqa: PLC0415  (the paths compared against)
    from trainctl.supervisor.model import layout, state  # noqa: PLC0415

    home, name = str(tmp_path), "job-1.a"
    assert layout.job_dir(home, name) == str(state.job_dir(tmp_path, name))
    assert layout.control_path(home, name) == str(state.job_dir(tmp_path, name) / control.SOCK_NAME)
    assert layout.queue_entry(home, name) == str(queue.entry_path(tmp_path, name))
    for bad in ("", ".", "..", "-x", "_x", ".x", "a/b", "a b", "é", "x" * 65, "a\n"):
        assert not layout.name_ok(bad), bad
        with pytest.raises(ConfigError):
            state.check_name(bad)
    for good in ("a", "A1", "job-1.a", "0_x", "x" * 64):
        assert layout.name_ok(good), good
        assert state.check_name(good) == good


def test_ctrl_c_while_it_waits_leaves_the_stop_to_the_supervisor(here: Harness) -> None:
    """The verb's first Ctrl-C, before the verb is even loaded: one line, exit 130, no
    traceback, and the supervisor finishes the stop (here a job that ignores SIGTERM, so
    it takes its 2 s grace and the KILL)."""
    h = here
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    h.tc("start", "--name", "e", "--grace", "2", "--", sys.executable, "-c", ignore, check=True)
    code = (
        "from trainctl.launcher import early; early.WAIT_S = 30.0; "
        "print('sending', flush=True); early.send_stop(['stop', 'e'])"
    )
    cli = subprocess.Popen(
        [sys.executable, "-c", code], env=h.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert cli.stdout is not None
    assert cli.stdout.readline().strip() == "sending"
    wait_for(lambda: h.events("e", "stopping"), what="the supervisor to have the request")
    cli.send_signal(signal.SIGINT)  # the Ctrl-C, to the process this test started
    _, err = cli.communicate(timeout=20)
    assert cli.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip() == "trainctl: the stop continues in the background (`trainctl status e`)"
    wait_for(lambda: not h.job_pids("e"), timeout_s=30, what="the supervisor's own stop")


def test_a_home_that_is_your_own_link_is_the_directory_it_points_at(harness: Harness) -> None:
    """`ln -s /scratch/me/trainctl ~/.local/state/trainctl` (a small home quota) was
    refused as "a symlink". The user's own link is followed once, where the home is read,
    and every path is built from its directory: the CLI's, the supervisor's --home and
    the early stop's, so the stop still goes out before the verb."""
    h = harness
    real = h.tmp / "scratch" / "tc"
    real.mkdir(parents=True, mode=0o700)
    link = h.tmp / "linked-home"
    link.symlink_to(real)
    env = {**h.env, "TRAINCTL_HOME": str(link)}
    h.tc("start", "--name", "ln", "--", "sleep", "600", env=env, check=True)
    st = json.loads((real / "jobs" / "ln" / "state.json").read_text())
    argv = Path(f"/proc/{st['supervisor']['pid']}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--home") + 1] == os.fsencode(real)
    assert early.home_of(str(link)) == str(real)
    assert h.tc("status", "ln", env=env).out.startswith("ln: running")
    stop = h.tc("stop", "ln", "--json", env=env, check=True)
    assert stop.json()["via"] == "supervisor"
    assert "ran" not in stop.err  # the early request was found and read by the verb
