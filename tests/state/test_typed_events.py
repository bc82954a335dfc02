"""The events trainctl reads back are typed (supervisor/model/events.py): each kind is one
record, written as that record and read back as it, checked; a line that does not fit is
skipped, never trusted. Issue 45, item 3."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainctl.supervisor.model import events, wire
from trainctl.supervisor.model.deploys import DeployReport
from trainctl.supervisor.model.reports import Cause, NamedProc
from trainctl.supervisor.model.sections import CodeRecord
from trainctl.supervisor.records import field_names, replace

SAMPLES: list[events.Event] = [
    events.Started("j", 2, 4242, ["python", "train.py"], "/w", "cgroup", "/sys/fs/x", [0, 3]),
    events.Code(2, "/w", "git", CodeRecord(git_head="ab" * 20, dirty=True, diff_sha="cd" * 20)),
    events.Code(3, "/w"),
    events.MainExited(4242, 143),
    events.MainExited(4243, None, adopted=True),
    events.Stopping("stop", 30.0, "tree"),
    events.Stopping("stop", 5.0, "all", supervisor="gone"),
    events.GraceShortened(1.5),
    events.Escalated("cgroup", 2, 1, [NamedProc(7, "python worker.py")]),
    events.Escalated(via="scancel"),
    events.Ended(2, "stopped", Cause(kind="stopped", summary="stopped by trainctl stop")),
    events.RestartScheduled(4.0, 1, 2, 1, 1700000000.5, "main exited", Cause("exit", "exit 1")),
    events.Stalled(600.0, "restart"),
    events.Unstalled(),
    events.Dispatched("j", 3, 12.5, "0,1"),
    events.Deploy("rolled-back", 3, 4, 5, "a" * 40, "b" * 40, "/w/ckpt.pt"),
]


@pytest.mark.parametrize("ev", SAMPLES, ids=lambda e: type(e).__name__)
def test_each_typed_kind_reads_back_as_it_was_written(tmp_path: Path, ev: events.Event) -> None:
    events.append_event(tmp_path, ev)
    log = events.EventLog(_FileSink(tmp_path), job="j")
    log.info(ev)
    raw = events.read_events(tmp_path)
    assert [d["event"] for d in raw] == [ev.KIND, ev.KIND]
    assert raw[1]["job"] == "j"  # the log's bound fields come along
    back = events.read_typed(tmp_path)
    assert len(back) == 2
    for got, doc in zip(back, raw, strict=True):
        assert got.ts == doc["ts"] > 0
        assert replace(got, ts=0.0) == ev


class _FileSink:
    def __init__(self, jdir: Path) -> None:
        self.jdir = jdir

    def write(self, text: str) -> None:
        fd = events.open_events(self.jdir)
        try:
            events.write_event_line(fd, text)
        finally:
            os.close(fd)


def test_a_typed_kind_written_by_name_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"'ended' event is typed: write events\.Ended"):
        events.append_event(tmp_path, "ended", run=1, phase="stopped")
    with pytest.raises(TypeError, match="typed"):
        events.EventLog(_FileSink(tmp_path)).info("stopping", reason="stop")
    assert not events.path(tmp_path).exists()
    events.append_event(tmp_path, "signal_sent", members=3)  # a diagnostic: free-form
    assert [d["event"] for d in events.read_events(tmp_path)] == ["signal_sent"]
    assert events.read_typed(tmp_path) == []


def test_a_line_that_does_not_fit_its_record_is_skipped_not_trusted(tmp_path: Path) -> None:
    lines = [
        {"ts": 1.0, "event": "ended", "run": "two", "phase": "stopped"},  # run not a number
        {"ts": 2.0, "event": "started", "run": 1},  # fields missing
        {"ts": -3.0, "event": "unstalled"},  # a time before the epoch
        {"ts": 4.0, "event": "stopping", "reason": "stop", "grace_s": 5, "order": None},
    ]
    events.path(tmp_path).write_text("".join(json.dumps(d) + "\n" for d in lines))
    assert len(events.read_events(tmp_path)) == 4  # the raw reader keeps every JSON line
    [only] = events.read_typed(tmp_path)
    assert only == events.Stopping("stop", 5.0, None, ts=4.0)
    assert [type(e) for e in events.newest_typed(tmp_path, 1 << 16)] == [events.Stopping]


def test_the_code_event_stays_flat_as_older_logs_have_it(tmp_path: Path) -> None:
    """`history` reads the logs of runs started by older trainctl versions too."""
    code = CodeRecord(git_head="ab" * 20, snapshot="git", untracked=("a.py",))
    events.append_event(tmp_path, events.Code(7, "/w", "git", code))
    [doc] = events.read_events(tmp_path)
    assert doc["git_head"] == "ab" * 20
    assert doc["snapshot"] == "git"
    assert "code" not in doc
    old = {"ts": 9.0, "event": "code", "run": 8, "cwd": "/w", "git_head": "cd" * 20}
    with events.path(tmp_path).open("a") as f:
        f.write(json.dumps(old) + "\n")
    first, second = events.read_typed(tmp_path)
    assert isinstance(first, events.Code)
    assert first.code == code
    assert isinstance(second, events.Code)
    assert second.code == CodeRecord(git_head="cd" * 20)


def test_the_deploy_event_reads_what_the_deployers_report_writes(tmp_path: Path) -> None:
    """The deployer (launcher/) writes its whole report; the typed event is the part
    trainctl reads back: each of its fields is a field of the report, of the same type."""
    hints = typing.get_type_hints(DeployReport)
    mine = typing.get_type_hints(events.Deploy)
    for name in field_names(events.Deploy):
        if name != "ts":
            assert name in hints, name
            assert mine[name] == hints[name], name
    rep = DeployReport(
        id="d1", name="j", outcome="deployed", step="probation", summary="ok",
        from_run=1, to_run=2, from_commit="a" * 40, to_commit="b" * 40, checkpoint="/c.pt",
    )  # fmt: skip
    events.append_event(tmp_path, rep.event(), **rep.to_doc())
    [doc] = events.read_events(tmp_path)
    assert doc["summary"] == "ok"  # the whole report
    assert doc["step"] == "probation"
    [back] = events.read_typed(tmp_path)
    assert replace(back, ts=0.0) == rep.event()


@given(
    op=st.sampled_from(["stop", "members", "ping", "checkpoint"]),
    fields=st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**40), 2**40),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=20),
        ),
        max_size=5,
    ),
)
def test_a_request_on_the_wire_is_json_that_reads_back_as_sent(op: str, fields: dict) -> None:  # type: ignore[type-arg]
    """issue 55 §4: the requests' one encoder (model/wire.py), which early.py uses before
    json is imported, writes JSON that json reads back as it was given."""
    fields.pop("op", None)
    line = wire.request(op, **fields)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert json.loads(line) == {"op": op, **fields}
