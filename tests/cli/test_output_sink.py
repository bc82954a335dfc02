"""An invocation's output sink (issue 45 item 6): every line of text a verb prints goes
through render.out() to the innermost render.to() of its thread, so a verb runs
in-process for the web page (and MCP) without touching the process's stdout."""

from __future__ import annotations

import io
import threading

import pytest

from tests.conftest import Harness
from trainctl.launcher import render, verbs
from trainctl.launcher.verbs import Invocation


def test_a_verbs_text_goes_to_its_sink_not_stdout(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    h = harness
    h.tc("start", "--name", "s", "--", "sleep", "60", check=True)
    buf = io.StringIO()
    with render.to(buf):
        code = verbs.load("status").run(Invocation(str(h.home)), "s")
    assert code == 0
    assert buf.getvalue().startswith("s: running, run 1\n"), buf.getvalue()
    assert capsys.readouterr().out == ""
    # one sink a thread: another thread's output is its own
    other = io.StringIO()

    def in_thread() -> None:
        with render.to(other):
            render.line("from the other thread")

    with render.to(buf):
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        render.line("from this one")
    assert other.getvalue() == "from the other thread\n"
    assert buf.getvalue().endswith("from this one\n")
    render.line("to stdout again")
    assert capsys.readouterr().out == "to stdout again\n"
    h.tc("stop", "s", check=True)
