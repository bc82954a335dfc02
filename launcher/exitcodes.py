"""Exit codes, and the mapping from trainctl's error tree to them (no click import here)."""

from __future__ import annotations

from enum import IntEnum

from trainctl.supervisor.errors import (
    ConfigError,
    JobNotFoundError,
    RemoteError,
    StateError,
    TrainctlError,
)


class ExitCode(IntEnum):
    """Every exit status trainctl uses (README "Exit codes")."""

    OK = 0
    FAILED = 1  # the operation failed (survivors, start failed, name clash, ...)
    USAGE = 2  # bad flag, bad config, unknown job
    NOT_RUNNING = 3  # status: the job is not running
    STATE_UNKNOWN = 4  # state untrusted or supervisor lost
    REMOTE = 5
    INTERNAL = 70
    TIMEOUT = 124  # wait --timeout expired
    INTERRUPTED = 130


def exit_code_for(err: TrainctlError) -> ExitCode:
    """Map an error class to its exit code."""
    if isinstance(err, ConfigError | JobNotFoundError):
        return ExitCode.USAGE
    if isinstance(err, StateError):
        return ExitCode.STATE_UNKNOWN
    if isinstance(err, RemoteError):
        return ExitCode.REMOTE
    return ExitCode.FAILED
