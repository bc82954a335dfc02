"""The sections of a run's state and the documents that cross a process boundary are
records end to end: written as JSON, read back field by field, refused in one line."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import typing
from pathlib import Path
from typing import Any

import pytest

import trainctl.launcher.results
import trainctl.supervisor
from tests.state.test_state import sample
from trainctl.supervisor.errors import StateError
from trainctl.supervisor.life.hooks import HookJob
from trainctl.supervisor.model import schema, state
from trainctl.supervisor.model.reports import (
    Cause,
    Failure,
    NodeStop,
    RestartEntry,
    SlurmStopReport,
    SlurmVerdict,
    StopReport,
)
from trainctl.supervisor.model.sections import Adoption, CodeRecord, SlurmRecord
from trainctl.supervisor.model.state import JobState, Phase, state_from_doc, state_to_doc
from trainctl.supervisor.tree.launch import AdoptRequest, Handover

CAUSE = Cause(kind="exit", summary="exit code 3", exit_code=3, reason="ValueError: x")


def full() -> JobState:
    """A state with every section filled in."""
    return dataclasses.replace(
        sample(),
        last_stop=StopReport(signal="SIGTERM", ok=True, found=3, cause=CAUSE),
        last_failure=Failure(run=2, exit_code=3, at=10.0, reason="main exited", cause=CAUSE),
        restart_history=(RestartEntry(run=1, at=5.0, cause="exit code 3", kind="exit"),),
        cause=CAUSE,
        code=CodeRecord(git_head="a" * 40, dirty=True, diff_sha="b" * 64),
        adopted=Adoption(how="--pid 9", contained=False, why_not="not root", at=1.0, members=2),
        slurm=SlurmRecord(job_id="42", script="/x.sbatch", submitted_at=1.0, num_nodes=2),
    )


def test_every_section_round_trips_as_its_record(tmp_path: Path) -> None:
    st = full()
    state.write_state(tmp_path, st)
    back = state.read_state(tmp_path)
    assert back == st
    assert isinstance(back.cause, Cause)
    assert isinstance(back.last_failure, Failure)
    assert isinstance(back.last_failure.cause, Cause)
    assert isinstance(back.restart_history[0], RestartEntry)
    assert isinstance(back.adopted, Adoption)
    assert back.adopted.containment() == "adopted, not contained: not root"


def test_a_slurm_stop_report_is_read_back_as_one() -> None:
    verdict = SlurmVerdict(state="CANCELLED", phase=Phase.STOPPED, exit_code=0)
    report = SlurmStopReport(slurm=verdict, nodes=[NodeStop(node="n1", ok=True)], ok=True)
    st = dataclasses.replace(sample(), last_stop=report, backend="slurm")
    back = state_from_doc(json.loads(json.dumps(state_to_doc(st))), "state.json")
    assert back.last_stop == report
    assert isinstance(back.last_stop, SlurmStopReport)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("cause", {"summary": "no kind"}, "cause"),
        ("cause", {"kind": "exit", "summary": "x", "exit_code": "3"}, "exit_code"),
        ("last_failure", {"run": 2, "cause": {"kind": 7, "summary": ""}}, "kind"),
        ("restart_history", [{"run": 1, "at": "soon"}], "restart_history[0]"),
        ("adopted", {"how": "--pid 1", "contained": "yes"}, "contained"),
        ("slurm", {"script": "/x"}, "slurm"),
        ("code", {"git_head": 12}, "git_head"),
        ("last_stop", {"ok": "true"}, "ok"),
        ("last_stop", {"mode": "slurm", "ok": True}, "last_stop"),  # no Slurm verdict
    ],
)
def test_a_mistyped_section_is_refused_in_one_line_naming_it(
    key: str, value: Any, named: str
) -> None:
    doc = json.loads(json.dumps(state_to_doc(full())))
    doc[key] = value
    with pytest.raises(StateError, match=r"refusing|must be|expected|missing") as e:
        state_from_doc(doc, "state.json")
    assert named in str(e.value)
    assert "\n" not in str(e.value)


def test_a_state_written_before_the_records_is_read_the_same() -> None:
    """Sections as older versions wrote them: a cause without its None fields, an empty
    code section, a report of the few fields a cancelled backoff had."""
    doc = json.loads(json.dumps(state_to_doc(sample())))
    doc.update(
        cause={"kind": "stopped", "summary": "stopped by trainctl stop", "by": "stop"},
        code={},
        last_stop={"ok": True, "already_stopped": True, "reason": "stop during restart backoff"},
        restart_history=[{"run": 1, "at": 2.0, "cause": "exit code 3", "kind": "exit"}],
    )
    st = state_from_doc(doc, "state.json")
    assert st.cause == Cause(kind="stopped", summary="stopped by trainctl stop", by="stop")
    assert st.code is not None
    assert not st.code.recorded  # nothing to compare against: no drift is ever claimed
    assert isinstance(st.last_stop, StopReport)
    assert st.last_stop.already_stopped


def test_the_handover_to_a_new_supervisor_is_checked_field_by_field() -> None:
    ho = Handover(
        run=2,
        marker="m" * 32,
        last_failure=Failure(run=1, cause=CAUSE),
        restart_history=(RestartEntry(run=1, at=1.0),),
        adopt=AdoptRequest(how="--pid 5", main=(5, 100), members=((5, 100), (6, 101))),
    )
    wire = json.loads(json.dumps(ho.to_doc()))
    assert Handover.from_doc(wire) == ho
    for bad in (
        {**wire, "adopt": {**wire["adopt"], "main": [5]}},  # a pid without its start time
        {**wire, "adopt": {**wire["adopt"], "main": [5, "x"]}},
        {**wire, "last_failure": {"run": "one"}},
        {**wire, "restart_history": {"run": 1}},
        {"marker": "m" * 32},  # no run
    ):
        with pytest.raises(StateError, match="the supervisor's handover"):
            Handover.from_doc(bad)


def test_the_hook_runners_job_is_checked_field_by_field() -> None:
    job = HookJob(jdir="/j", run=1, event="exit", cwd="/", timeout_s=5.0, env={"A": "1"})
    assert HookJob.from_doc(json.loads(json.dumps(job.to_doc())), "hook") == job
    for bad in ({**job.to_doc(), "env": {"A": 1}}, {**job.to_doc(), "argv": "rm -rf /"}):
        with pytest.raises(StateError):
            HookJob.from_doc(bad, "hook")


def test_no_section_of_the_state_is_a_bare_dict() -> None:
    """issue 34: JobState carries records, never ``dict[str, Any]`` sections."""
    hints = typing.get_type_hints(JobState)
    loose = [name for name, hint in hints.items() if "dict" in str(hint)]
    assert loose == []


def _record_classes() -> list[type]:
    """Every record class of the supervisor and of the launcher's results."""
    found: dict[str, type] = {}
    for pkg in (trainctl.supervisor, trainctl.launcher.results):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith(".__main__"):
                continue  # the supervisor's command: it would run
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if isinstance(value, type) and "__record_fields__" in value.__dict__:
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_the_schemas_type_hints_are_typings_for_every_record() -> None:
    """schema.type_hints compiles each annotation text once instead of typing's once a
    field (2 ms of a status): it must give what typing.get_type_hints gives, everywhere."""
    classes = _record_classes()
    assert len(classes) > 100  # the walk found the records (175 on the status path alone)
    checked = 0
    for cls in classes:
        try:
            theirs = typing.get_type_hints(cls)
        except NameError:  # a name imported for the type checker only: no schema reads it
            with pytest.raises(NameError):
                schema.type_hints(cls)
            continue
        assert schema.type_hints(cls) == theirs, cls.__qualname__
        checked += 1
    assert checked > 100
