"""What changed on disk since a run started: its code (git, entry script) and its spec file.

Imported by `status` only when a cheap stat says something may have changed (it brings
git's subprocess, hashlib and tomllib: ~10 ms that an unchanged job never pays).
"""

from __future__ import annotations

from trainctl.launcher.specfile import file_changes
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState
from trainctl.supervisor.watch.drift import drift


def code_changes(st: JobState, spec: Spec) -> list[str]:
    """What differs from the code the run started with (git HEAD, diff, entry script)."""
    return drift(st.code, spec)


def spec_changes(spec: Spec) -> list[str]:
    """The spec file's keys whose value differs from what it gave at start."""
    if not spec.spec_file or spec.file_keys is None:
        return []
    return file_changes(spec.spec_file, spec.file_keys)
