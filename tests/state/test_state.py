"""State documents: round trips, refusal of anything untrusted, legal phase moves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainctl.supervisor.errors import ConfigError, JobNotFoundError, StateError
from trainctl.supervisor.model import events, state
from trainctl.supervisor.model.state import JobState, MemberSnap, Phase, ProcRef


def sample() -> JobState:
    return JobState(
        name="job",
        run=3,
        phase=Phase.RUNNING,
        marker="f" * 32,
        started_at=1.5,
        supervisor=ProcRef(10, 100),
        main=ProcRef(11, 101),
        pgid=11,
        sid=11,
        members=(MemberSnap(11, 101, 10, 11, 11, "python train.py", ("main",)),),
    )


def test_round_trip(tmp_path: Path) -> None:
    st = sample()
    state.write_state(tmp_path, st)
    assert state.read_state(tmp_path) == st
    assert oct((tmp_path / "state.json").stat().st_mode & 0o777) == "0o600"
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    "text", ["", "{", "null", "[]", '{"schema": 1}', '{"schema": 2, "name": "x"}', "\udcff"]
)
def test_untrusted_documents_raise_state_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "state.json").write_text(text, errors="surrogateescape")
    with pytest.raises(StateError):
        state.read_state(tmp_path)


def test_bad_field_types_raise(tmp_path: Path) -> None:
    doc = state.state_to_doc(sample())
    for key, bad in (
        ("phase", "dancing"),
        ("main", {"pid": 1}),
        ("marker", "short"),
        ("members", [{"pid": 1}]),
    ):
        (tmp_path / "state.json").write_text(json.dumps({**doc, key: bad}))
        with pytest.raises(StateError):
            state.read_state(tmp_path)


def test_missing_state_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(JobNotFoundError):
        state.read_state(tmp_path)


def test_group_writable_state_is_refused(tmp_path: Path) -> None:
    state.write_state(tmp_path, sample())
    (tmp_path / "state.json").chmod(0o620)
    with pytest.raises(StateError, match="writable by other users"):
        state.read_state(tmp_path)


def test_foreign_owner_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    state.write_state(tmp_path, sample())
    os.chown(tmp_path / "state.json", 4242, 4242)
    with pytest.raises(StateError, match="uid 4242"):
        state.read_state(tmp_path)


def test_phase_moves() -> None:
    st = sample()
    assert st.moved(Phase.STOPPING).moved(Phase.STOPPED).phase == Phase.STOPPED
    with pytest.raises(StateError, match="illegal phase move"):
        st.moved(Phase.STOPPED).moved(Phase.RUNNING)
    for phase, nexts in state.TRANSITIONS.items():
        assert phase not in nexts or phase == Phase.STARTING
    assert Phase.LOST not in state.TRANSITIONS  # derived, never stored


@pytest.mark.parametrize("name", ["", "-x", "a/b", "..", "x" * 65, "a b", "ü"])
def test_bad_names(name: str) -> None:
    with pytest.raises(ConfigError):
        state.check_name(name)


def test_lock_is_exclusive(tmp_path: Path) -> None:
    from trainctl.supervisor.errors import JobConflictError  # noqa: PLC0415

    with state.job_lock(tmp_path, 1):
        assert state.is_locked(tmp_path, "lock")
        with pytest.raises(JobConflictError, match="busy"), state.job_lock(tmp_path, 0.1):
            pass
    assert not state.is_locked(tmp_path, "lock")


def test_files_are_opened_relative_to_a_directory_that_is_not_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "victim").write_text("keep")
    jdir = tmp_path / "job"
    jdir.symlink_to(real)  # a job directory swapped for a symlink after any check
    with pytest.raises(StateError, match="symlink"):
        state.write_bytes_atomic(jdir / "victim", b"overwritten")
    with pytest.raises(StateError, match="symlink"):
        events.append_event(jdir, "x")
    with pytest.raises(StateError, match="symlink"):
        state.read_state(jdir)
    assert (real / "victim").read_text() == "keep"
    assert sorted(p.name for p in real.iterdir()) == ["victim"]


def test_a_file_that_is_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "events.jsonl").symlink_to(target)
    (tmp_path / "state.json").symlink_to(target)
    (tmp_path / "lock").symlink_to(target)
    with pytest.raises(StateError, match="symlink"):
        events.append_event(tmp_path, "x")
    with pytest.raises(StateError, match="symlink"):
        state.read_state(tmp_path)
    with pytest.raises(StateError, match="symlink"), state.job_lock(tmp_path, 1.0):
        pass
    assert target.read_text() == "keep"
    state.write_state(tmp_path, sample())  # replacing a planted symlink is safe: rename
    assert target.read_text() == "keep"
    assert not (tmp_path / "state.json").is_symlink()
