"""Property tests: whatever a state, spec or config document holds, reading it ends in the
object or in one StateError/ConfigError line, never in another exception (exit 70)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.state.test_state import sample
from trainctl.launcher.config import _apply
from trainctl.supervisor.errors import ConfigError, StateError
from trainctl.supervisor.model.reports import StopReport
from trainctl.supervisor.model.spec import (
    RestartPolicy,
    Spec,
    StopPolicy,
    spec_from_doc,
    spec_to_doc,
)
from trainctl.supervisor.model.state import JobState, state_from_doc, state_to_doc

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)

STATE = state_to_doc(dataclasses.replace(sample(), last_stop=StopReport(ok=True)))
SPEC = spec_to_doc(
    Spec(
        name="job",
        argv=("python", "t.py"),
        cwd="/",
        env={"A": "1"},
        stop=StopPolicy(grace_s=5.0),
        restart=RestartPolicy(exit_codes=(1, 2)),
    )
)


def _one_line(e: Exception) -> None:
    text = str(e)
    assert text
    assert text.isprintable(), text


def _mutated(base: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    doc = json.loads(json.dumps(base))
    for key in data.draw(st.lists(st.sampled_from(sorted(doc)), min_size=1, max_size=3)):
        if isinstance(doc[key], dict) and doc[key] and data.draw(st.booleans()):
            inner = data.draw(st.sampled_from(sorted(doc[key])))  # a key inside a section
            doc[key][inner] = data.draw(JSON)
        else:
            doc[key] = data.draw(JSON)
    if data.draw(st.booleans()):
        doc[data.draw(st.text(max_size=8))] = data.draw(JSON)
    return doc


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_state_document_is_read_or_refused_in_one_line(data: st.DataObject) -> None:
    doc = _mutated(STATE, data)
    try:
        got = state_from_doc(doc, "state.json")
    except StateError as e:
        _one_line(e)
        return
    assert isinstance(got, JobState)
    dataclasses.replace(got)  # a usable object, every field of its declared type


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_spec_document_is_read_or_refused_in_one_line(data: st.DataObject) -> None:
    doc = _mutated(SPEC, data)
    try:
        spec_from_doc(doc, "spec.json")
    except StateError as e:
        _one_line(e)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["stop", "start", "logs", "gpu", "x"]),
        st.dictionaries(
            st.sampled_from(
                [
                    "grace_s",
                    "signal",
                    "order",
                    "kill_wait_s",
                    "cgroup",
                    "tail_lines",
                    "follow_poll_s",
                    "ready_timeout_s",
                    "tolerance_mib",
                    "y",
                ]
            ),
            JSON,
            max_size=3,
        ),
        max_size=3,
    )
)
def test_any_config_document_is_applied_or_refused_in_one_line(doc: dict[str, Any]) -> None:
    try:
        _apply({}, doc, "config.toml")
    except ConfigError as e:
        _one_line(e)
