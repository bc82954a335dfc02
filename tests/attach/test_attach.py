"""`start --tty` and `attach`: a job's terminal, typed into from a real tmux pane.

Real jobs, real supervisors, a real pty, and the real `trainctl attach` on a tmux pane's
terminal (send-keys types, capture-pane reads the screen), as a tmux user would.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import TRAINCTL, Harness, kill_verified, wait_for
from tests.helpers import Pane, one_line_error
from trainctl.launcher.ops.attach import read_reply_line
from trainctl.launcher.verbs.attach import DetachMatcher, parse_detach_keys
from trainctl.supervisor.tree.terminal import INPUT, OUTPUT, FrameReader, frame

NEEDS_TMUX = pytest.mark.skipif(
    not shutil.which("tmux"), reason="tmux not installed (apt-get install tmux)"
)

# A training-like loop that stops in pdb at step 3, prints a step every 0.2 s, and says
# when its terminal's Ctrl-C reaches it (as a KeyboardInterrupt it survives).
DEBUGGED = """
import sys, time
print("tty", sys.stdin.isatty(), flush=True)
step = 0
while True:
    try:
        step += 1
        if step == 3:
            breakpoint()
        print(f"step {step}", flush=True)
        time.sleep(0.2)
    except KeyboardInterrupt:
        print("got SIGINT from the terminal", flush=True)
"""

# Reads lines and answers each: input through a non-terminal attach
ECHO = """
import sys
print("ready", flush=True)
for line in sys.stdin:
    print("got " + line.strip(), flush=True)
"""


def start_tty(h: Harness, name: str, script: str, *extra: str) -> None:
    h.tc(
        "start", "--name", name, "--tty", "--grace", "5", *extra, "--",
        sys.executable, "-c", script, check=True,
    )  # fmt: skip


def log_of(h: Harness, name: str) -> str:
    return (h.home / "jobs" / name / "logs" / "run-1.log").read_text(errors="replace")


def steps_on(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^step (\d+)\s*$", text, re.MULTILINE)]


@NEEDS_TMUX
@pytest.mark.slow
def test_attach_in_tmux_pdb_detach_reattach_ctrl_c_and_a_stop(harness: Harness) -> None:
    """A breakpoint() answered from a tmux pane; detach leaves the job running; a reattach
    shows what it printed meanwhile; Ctrl-C reaches the job, not a stop; a stop while
    attached ends the attach with the stop's report and the terminal restored."""
    h = harness
    start_tty(h, "dbg", DEBUGGED)
    wait_for(lambda: "(Pdb)" in log_of(h, "dbg"), 20, "the job to stop in pdb")
    assert "tty True" in log_of(h, "dbg")  # main's stdin is a terminal
    assert "trainctl attach dbg" in h.tc("status", "dbg").out
    attach = " ".join([*TRAINCTL, "attach", "dbg"])
    pane = Pane(h, ["sh", "-c", f"{attach}; echo attach-rc=$?; stty -a; read x"])
    try:
        wait_for(lambda: "(Pdb)" in pane.screen(), 20, "the pdb prompt on the pane")
        pane.keys("p step", "Enter")
        wait_for(lambda: re.search(r"p step\s*\n3\s*\n", pane.screen()), 10, "pdb's answer")
        pane.keys("p tuple(__import__('os').get_terminal_size())", "Enter")  # the pane's size
        wait_for(lambda: "(120, 30)" in pane.screen(), 10, "the window size passed through")
        pane.keys("c", "Enter")
        wait_for(lambda: "step 5" in pane.screen(), 10, "the loop to go on")
        pane.keys("C-\\", "d")
        wait_for(lambda: "attach-rc=0" in pane.screen(), 10, "the detach")
        assert "detached from dbg; it keeps running" in pane.screen()
        seen = max(steps_on(pane.screen()))
        wait_for(lambda: max(steps_on(log_of(h, "dbg"))) >= seen + 5, 20, "output while away")
        assert h.tc("status", "dbg").rc == 0  # detaching stopped nothing
        pane.close()

        pane = Pane(h, ["sh", "-c", f"{attach}; echo attach-rc=$?; stty -a; read x"])
        wait_for(lambda: steps_on(pane.screen()), 20, "the reattach")
        missed = [n for n in steps_on(pane.screen()) if n > seen]
        assert missed, pane.screen()  # the screen it missed ...
        assert min(missed) <= seen + 5, pane.screen()  # ... from where it left

        # The job's terminal turns Ctrl-C into the job's own SIGINT: after `c`, pdb's
        # handler takes it and breaks into the debugger again, as it does in tmux.
        pane.keys("C-c")
        wait_for(lambda: "Program interrupted" in pane.screen(), 10, "pdb to take the SIGINT")
        assert h.tc("status", "dbg").rc == 0  # still running: no stop was made of it
        assert "stopping" not in (h.home / "jobs" / "dbg" / "events.jsonl").read_text()

        stop = h.tc("stop", "dbg")
        assert stop.rc == 0, stop
        wait_for(lambda: "attach-rc=0" in pane.screen(), 20, "the attach to end")
        screen = pane.screen()
        assert "dbg ended: stopped: stopped by trainctl stop" in screen, screen
        assert "stop: nothing of the job is alive" in screen, screen
        assert re.search(r"(^|\s)icanon\b", screen), screen  # the terminal is cooked again
        assert "-icanon" not in screen, screen
    finally:
        pane.close()


def test_attach_refusals_each_one_line(harness: Harness) -> None:
    h = harness
    h.tc("start", "--name", "plain", "--", "sleep", "600", check=True)
    no_tty = h.tc("attach", "plain")
    one_line_error(no_tty, 1, "job plain has no terminal: start it with `trainctl start --tty")
    assert "trainctl logs -f plain" in no_tty.err
    one_line_error(h.tc("attach", "plian"), 2, "did you mean plain?")
    one_line_error(h.tc("attach", "plain", "--detach-keys", "ctrl-"), 2, "--detach-keys")
    assert h.tc("stop", "plain").rc == 0
    one_line_error(h.tc("attach", "plain"), 3, "job plain is not running (stopped)")
    slurm = h.tc("start", "--name", "s", "--backend", "slurm", "--tty", "--", "true")
    one_line_error(slurm, 2, "--tty: a terminal to attach to is for local jobs")
    assert h.tc("status", "s").rc == 2  # nothing was made of it


def test_an_attach_request_on_the_wire_is_a_checked_record(harness: Harness) -> None:
    """The attach protocol's messages are records (control.AttachAsk, AttachReply): a
    mistyped request gets an error naming its field, not a crash or a silent default, and
    the supervisor goes on serving (a well-formed attach after it is answered)."""
    h = harness
    start_tty(h, "w", ECHO)
    wait_for(lambda: "ready" in log_of(h, "w"), 20, "the job's first line")
    sock_path = h.home / "jobs" / "w" / "control.sock"
    for line, needle in (
        (b'{"op": "attach", "read_only": true, "rows": "tall", "cols": 80}\n', "rows"),
        (b'{"op": "ping"}\n', '"phase": "running"'),
        (b'{"op": "teleport"}\n', '"code": "unknown-op"'),  # a newer client's (issue 55)
        (b'{"op": "stop", "grace_s": "soon"}\n', '"code": "bad-request"'),
        (b'{"op": "attach", "read_only": true, "rows": 24, "cols": 80}\n', '"ok": true'),
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock_path))
            s.sendall(line)
            doc, _rest = read_reply_line(s)
        text = json.dumps(doc)
        assert needle in text, text
        if needle == "rows":
            assert (doc["ok"], doc["code"]) == (False, "bad-request")
        if "ping" in line.decode():
            assert doc["protocol"] == 2  # control.PROTOCOL
    assert h.tc("stop", "w").rc == 0


def _attach_proc(h: Harness, name: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*TRAINCTL, "attach", name, *extra],
        env=h.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_one_writer_many_readers_and_input_without_a_terminal(harness: Harness) -> None:
    """Keys from a piped attach reach the job; a second writer is refused while one is
    attached; a --read-only viewer sees the output and is told of the end."""
    h = harness
    start_tty(h, "echo", ECHO)
    wait_for(lambda: "ready" in log_of(h, "echo"), 20, "the job")
    writer = _attach_proc(h, "echo")
    try:
        assert writer.stdin is not None
        writer.stdin.write(b"hello\n")
        writer.stdin.flush()
        wait_for(lambda: "got hello" in log_of(h, "echo"), 10, "the typed line")
        second = h.tc("attach", "echo")
        one_line_error(second, 1, "a writer is attached already")
        viewer = _attach_proc(h, "echo", "--read-only")
        time.sleep(0.3)  # the viewer is connected (its replay includes 'got hello')
        writer.stdin.write(b"again\n")
        writer.stdin.flush()
        wait_for(lambda: "got again" in log_of(h, "echo"), 10, "the second line")
        assert h.tc("stop", "echo").rc == 0
        out, err = viewer.communicate(timeout=20)
        assert viewer.returncode == 0, err
        assert b"got hello" in out
        assert b"got again" in out
        assert b"echo ended: stopped" in err
        _, werr = writer.communicate(timeout=20)  # closes its stdin: it watches on
        assert writer.returncode == 0, werr
        assert b"echo ended: stopped" in werr
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()


def test_a_restart_keeps_the_terminal_and_the_log_keeps_every_byte(harness: Harness) -> None:
    """The log of a --tty run is the job's output (the pty's CRLF), whoever watches."""
    h = harness
    start_tty(h, "short", "print('one'); print('two')")
    assert h.tc("wait", "short", "--timeout", "30").rc == 0
    assert log_of(h, "short").replace("\r\n", "\n") == "one\ntwo\n"
    doc = h.tc("status", "short", "--json").json()
    assert isinstance(doc, dict)
    assert doc["state"] == "exited"


def test_frames_sent_right_behind_the_reply_line_are_kept() -> None:
    """The supervisor sends the screen to replay right after its reply: one read may hold
    both (seen in a full suite: the viewer took the frame for more JSON and crashed)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b'{"ok": true, "run": 1}\n' + frame(OUTPUT, b"the screen"))
        reply, early = read_reply_line(ours)
    assert reply == {"ok": True, "run": 1}
    assert FrameReader().feed(early) == [(OUTPUT, b"the screen")]


def test_detach_keys_and_frames() -> None:
    keys = parse_detach_keys("ctrl-\\,d")
    assert keys == b"\x1cd"
    assert parse_detach_keys("ctrl-a, ctrl-d") == b"\x01\x04"
    m = DetachMatcher(keys)
    assert m.feed(b"abc") == (b"abc", False)
    assert m.feed(b"x\x1c") == (b"x", False)  # held: it may be the start of the sequence
    assert m.feed(b"q") == (b"\x1cq", False)  # it was not: both go to the job
    # the prefix twice sends it once (tmux's send-prefix): it is not the start of a detach
    assert m.feed(b"\x1c\x1c") == (b"\x1c", False)
    assert m.feed(b"d") == (b"d", False)
    assert m.feed(b"\x1cd") == (b"", True)
    custom = DetachMatcher(parse_detach_keys("ctrl-a,x"))
    assert custom.feed(b"\x01\x01x") == (b"\x01x", False)
    assert custom.feed(b"\x01x") == (b"", True)
    single = DetachMatcher(parse_detach_keys("ctrl-q"))  # one key: it always detaches
    assert single.feed(b"a\x11") == (b"a", True)
    r = FrameReader()
    wire = frame(OUTPUT, b"hello") + frame(INPUT, b"")
    assert r.feed(wire[:3]) == []
    assert r.feed(wire[3:]) == [(OUTPUT, b"hello"), (INPUT, b"")]


def test_a_spec_files_tty_and_custom_detach_keys(harness: Harness) -> None:
    h = harness
    spec = h.tmp / "job.toml"
    argv = json.dumps([sys.executable, "-c", ECHO])
    spec.write_text(f'name = "fromspec"\nargv = {argv}\ntty = true\n')
    h.tc("start", "-c", str(spec), check=True)
    wait_for(lambda: "ready" in log_of(h, "fromspec"), 20, "the job")
    viewer = _attach_proc(h, "fromspec", "--detach-keys", "ctrl-a,x")
    _, err = viewer.communicate(b"hi\n\x01q\n\x01x", timeout=20)  # ^A q is not the sequence
    assert viewer.returncode == 0, err
    assert b"detached from fromspec; it keeps running" in err
    wait_for(lambda: "got hi" in log_of(h, "fromspec"), 30, "the typed line")
    assert "got \x01q" in log_of(h, "fromspec")  # the held ^A went through with its q
    assert h.tc("status", "fromspec").rc == 0
    assert h.tc("stop", "fromspec").rc == 0


def test_a_read_only_viewer_detaches_with_the_keys_and_types_nothing(harness: Harness) -> None:
    """Issue 44 §9: a --read-only viewer could not detach with the detach keys."""
    h = harness
    start_tty(h, "ro", ECHO)
    wait_for(lambda: "ready" in log_of(h, "ro"), 20, "the job")
    viewer = _attach_proc(h, "ro", "--read-only")
    _, err = viewer.communicate(b"typed\n\x1cd", timeout=20)
    assert viewer.returncode == 0, err
    assert b"detached from ro; it keeps running" in err
    time.sleep(0.3)
    assert "got typed" not in log_of(h, "ro")  # a viewer's keys go nowhere
    assert h.tc("status", "ro").rc == 0
    assert h.tc("stop", "ro").rc == 0


BURST = """
import os, sys, time
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.stdout.write(("x" * 99 + "\\n") * 50_000)  # 5 MB at once
sys.stdout.flush()
while True:
    time.sleep(1)
"""


def test_a_viewer_that_falls_behind_is_told_so_and_how_to_come_back(harness: Harness) -> None:
    """Issue 44 §9: dropped for lagging behind a 5 MB burst, the viewer said 'supervisor
    lost' (exit 4). It fell behind: it says so, and how to attach again."""
    h = harness
    go = h.tmp / "go"
    h.tc(
        "start", "--name", "lag", "--tty", "--grace", "5", "--", sys.executable, "-c", BURST,
        str(go), check=True,
    )  # fmt: skip
    wait_for(lambda: "ready" in log_of(h, "lag"), 20, "the job")
    viewer = _attach_proc(h, "lag", "--read-only")
    time.sleep(0.5)
    go.touch()  # its stdout is a pipe nobody reads yet: it falls behind
    wait_for(lambda: len(log_of(h, "lag")) > 4_000_000, 30, "the burst")
    time.sleep(2)
    _, err = viewer.communicate(timeout=30)
    assert viewer.returncode == 1, err[-500:]
    assert b"fell too far behind" in err
    assert b"trainctl attach lag to come back" in err
    assert h.tc("status", "lag").rc == 0  # the job runs on
    assert h.tc("stop", "lag").rc == 0


def test_a_viewer_whose_supervisor_is_killed_is_told_it_is_gone(harness: Harness) -> None:
    """Issue 54 §11: a --tty job's supervisor SIGKILLed under a viewer. Its socket closes
    a moment before its lock goes, so the viewer took it for alive and said it had fallen
    behind ("... keeps running: trainctl attach to come back"), which was false."""
    h = harness
    start_tty(h, "gone", ECHO)
    wait_for(lambda: "ready" in log_of(h, "gone"), 20, "the job")
    st = h.state("gone")
    sup = st["supervisor"]
    viewer = _attach_proc(h, "gone", "--read-only")
    time.sleep(0.5)
    kill_verified(sup["pid"], sup["start_ticks"])  # the supervisor this test started
    _, err = viewer.communicate(timeout=30)
    assert viewer.returncode == 4, err[-500:]
    assert b"supervisor was lost" in err
    assert b"fell too far behind" not in err
    h.tc("stop", "gone", check=True)  # the job itself: stopped from the state file
