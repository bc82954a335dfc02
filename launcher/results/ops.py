"""The records of the verbs off the status and stop paths: `restart`'s health window,
`adopt`'s plan and result, `doctor`'s checks.

In the records layer with the rest of ``results`` (they import nothing of the launcher
above them), but in a module of their own: `status` and `stop` import ``results``
alone, and each record defined there costs their start-up (issue 34 §4).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainctl.supervisor.records import record
from trainctl.supervisor.reports import Cause
from trainctl.supervisor.sections import Adoption
from trainctl.supervisor.state import JobState, MemberSnap


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report: what was looked at, what was found, and whether it is fine."""

    name: str
    value: str
    ok: bool
    hint: str = ""


@record(frozen=True)
class Health:
    """What the new run did in its first seconds: ``died`` with its cause, or it lives."""

    window_s: float
    died: bool = False
    cause: Cause | None = None
    last_lines: list[str] = field(default_factory=list)
    superseded_by: int | None = None  # another restart (or start) replaced it: that run

    @property
    def ok(self) -> bool:
        """Alive at the end of the window, ended cleanly within it, or ended by trainctl
        (another restart replaced it, a user stopped it): none of which is a failure."""
        if not self.died or self.superseded_by is not None:
            return True
        return self.cause is not None and self.cause.kind in ("clean", "stopped")


# One process to adopt: its identity (pid + start time), parent, group, session, command,
# and how it was found ("root", "session", "descendant"; a lost job's: its nets), the
# same record as a member of the job's snapshot.
Found = MemberSnap


@dataclass(frozen=True, slots=True)
class Plan:
    """What `adopt` would take over, before anything is changed."""

    how: str  # "--pid 123", "--tmux train:0"
    main: Found  # the oldest root: the run's main process (session leader where taken)
    members: list[Found]
    pgid: int | None  # recorded only when the whole process group is adopted
    sid: int | None  # ... and the whole session
    log_source: str | None  # a regular file behind main's stdout, read from adoption on
    panes: list[str] = field(default_factory=list)  # tmux pane ids, for pipe-pane
    tmux: list[str] = field(default_factory=list)  # the tmux command (socket) for them

    def to_doc(self) -> dict[str, object]:
        """The JSON form (`adopt --json`, `--dry-run`)."""
        return {
            "how": self.how,
            "main": self.main.pid,
            "members": [
                {"pid": m.pid, "ppid": m.ppid, "cmd": m.cmd, "how": "+".join(m.nets)}
                for m in self.members
            ],
            "process_group": self.pgid,
            "session": self.sid,
            "log_source": self.log_source,
            "panes": self.panes,
        }


@dataclass(frozen=True, slots=True)
class AdoptResult:
    """What `adopt` did: the run, its main, how many members, whether it is contained."""

    name: str
    run: int
    main_pid: int
    members: int
    mode: str
    contained: bool
    containment: str  # in words: contained (by whom), or not and why
    log_from: str | None  # where the run's log is copied from (None: nothing to copy)

    @classmethod
    def of(cls, st: JobState, plan: Plan, mode: str, log_from: str | None) -> AdoptResult:
        """The result, read back from the state the new supervisor wrote."""
        a = st.adopted or Adoption()
        return cls(
            st.name, st.run, plan.main.pid, len(plan.members), mode,
            a.contained, a.containment(), log_from,
        )  # fmt: skip

    def to_doc(self) -> dict[str, object]:
        """The JSON form."""
        return dataclasses.asdict(self)
