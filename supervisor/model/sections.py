"""The records a run's state carries beside its scalars: its code, its adoption, its Slurm job.

Each is a section of state.json, written with the state and read back field by field
(:func:`.schema.build_document`), so no reader has to guess at a dict's keys.
"""

from __future__ import annotations

import os

from trainctl.supervisor.records import record


@record(frozen=True)
class CodeRecord:
    """The code a run started with (drift detection compares the tree against it)."""

    git_head: str | None = None  # the commit of the job's cwd, when it is a git work tree
    dirty: bool | None = None  # `git diff HEAD` was not empty
    diff_sha: str | None = None  # the hash of that diff (empty diff included)
    entry: str | None = None  # the entry script argv names, when it names a file
    entry_sha: str | None = None
    untracked: tuple[str, ...] = ()  # untracked files (not in the commit), the first 50
    untracked_more: int = 0  # ... and how many more there were
    lock_file: str | None = None  # uv.lock, poetry.lock or requirements*.txt, if any
    lock_sha: str | None = None
    diff_file: str | None = None  # the uncommitted diff, kept with the run (under a cap)
    snapshot: str | None = None  # git | copy: the run executes from its own copy of the code
    tree_sha: str | None = None  # snapshot = copy: every file the copy takes (name, size, mtime)

    def line(self) -> str:
        """The code in one line: ``3f2a9c1e+5d41402a (dirty, snapshot git)``: the commit,
        and the uncommitted diff's hash beside it when the tree was dirty (two runs of one
        commit with different edits read apart)."""
        what = [self.git_head[:8]] if self.git_head else []
        if what and self.dirty and self.diff_sha:
            what[0] += f"+{self.diff_sha[:8]}"
        if not what and self.tree_sha:
            what.append(f"tree {self.tree_sha[:8]}")
        if not what and self.entry_sha:
            what.append(f"{os.path.basename(self.entry or '?')} {self.entry_sha[:8]}")
        notes = [
            n
            for n in ("dirty" if self.dirty else "", self.snapshot and f"snapshot {self.snapshot}")
            if n
        ]
        return " ".join(what) + (f" ({', '.join(notes)})" if notes else "") or "?"

    @property
    def recorded(self) -> bool:
        """Tell whether anything was recorded (neither a git tree nor an entry script:
        nothing to compare against)."""
        return self.git_head is not None or self.entry_sha is not None or self.tree_sha is not None


@record(frozen=True)
class Adoption:
    """How a run trainctl did not start was taken over (`trainctl adopt`)."""

    how: str = ""  # "--pid 123", "--tmux train:0"
    contained: bool = False  # moved into a job cgroup of its own
    contained_by: str | None = None  # "kernel" (a direct move) or "systemd" (the user's manager)
    why_not: str | None = None  # why it is not contained, in words (None: it is)
    log_source: str | None = None  # the file behind main's stdout, copied into the run's log
    at: float | None = None
    members: int = 0

    def containment(self) -> str:
        """The containment, in words (status, doctor and adopt say it alike)."""
        if self.contained:
            by = " (moved by systemd)" if self.contained_by == "systemd" else ""
            return f"contained in its own cgroup{by}"
        why = f": {self.why_not}" if self.why_not else ""
        return f"adopted, not contained{why}"


@record(frozen=True)
class SlurmRecord:
    """The Slurm job a run was submitted as (the Slurm backend)."""

    job_id: str
    script: str = ""
    submitted_at: float | None = None
    num_nodes: int = 1
    state: str | None = None  # Slurm's last word on it, once it has ended
