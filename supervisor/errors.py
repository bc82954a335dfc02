"""The exception tree at trainctl's boundary.

    TrainctlError                 base; carries a one-line, user-facing message
    ├── ConfigError               bad flag, bad TOML, bad signal name, unwritable home
    ├── StateError                state.json corrupt, truncated, unknown schema, foreign owner
    ├── JobNotFoundError          no such job
    ├── JobConflictError          name held by a live job, job not finished (rm), busy
    │   └── NotRunningError       no live run to act on (attach to an ended job): exit 3
    ├── SpawnError                the job's command could not be exec'd (not found, cwd missing)
    ├── ProcessTreeError          stop could not prove the tree gone
    ├── GpuError                  GPU binding / verification failures
    └── RemoteError               ssh / remote host failures

Only the CLI entry point maps these to exit codes (see trainctl.launcher.cli.ExitCode).
"""

from __future__ import annotations


class TrainctlError(Exception):
    """Base of every error trainctl reports to a user as one line."""

    def __str__(self) -> str:
        # One line, always: a message may quote a file's content or a job's argv, and a
        # newline or an escape sequence in it must not become a second line on a terminal.
        text = super().__str__()
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ConfigError(TrainctlError):
    """A flag, config file or environment value is invalid."""


class StateError(TrainctlError):
    """A job's state cannot be trusted (corrupt, unknown schema, wrong owner)."""


class JobNotFoundError(TrainctlError):
    """The named job does not exist."""


class JobConflictError(TrainctlError):
    """The job exists but is in the wrong phase for the operation."""


class NotRunningError(JobConflictError):
    """The job has no live run to act on (it is queued, ended or lost)."""


class SpawnError(TrainctlError):
    """The job's main process could not be started."""


class ProcessTreeError(TrainctlError):
    """Processes of the job survived the stop sequence."""


class GpuError(TrainctlError):
    """GPU binding or release verification failed."""


class RemoteError(TrainctlError):
    """A remote host could not be reached or answered badly."""
