"""Exit codes, and the one mapping from an exception to a line and an exit code.

Both entries (the fast path in ``main`` and click in ``cli``) end every error here, so the
same failure gives the same line and the same code whichever parsed the command line.
No click import here.
"""

from __future__ import annotations

import os
import sys
from enum import IntEnum

from trainctl.supervisor.errors import (
    ConfigError,
    JobNotFoundError,
    NotRunningError,
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
    NOT_PROVEN = 6  # stop: what was found is gone, but nothing proves it was all
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
    if isinstance(err, NotRunningError):
        return ExitCode.NOT_RUNNING
    return ExitCode.FAILED


def say_error(line: str) -> None:
    """One line on stderr, prefixed as every trainctl error is (nowhere when stderr is
    closed: `2>&-`)."""
    if sys.stderr is None:
        return
    sys.stderr.write(f"trainctl: {line}\n")
    sys.stderr.flush()


def exit_for_exception(e: BaseException) -> int:
    """Say what went wrong in one line (no traceback for a user's error); return the code.

    Called from inside an ``except`` block: an internal error keeps its traceback in a
    file for the report.
    """
    if isinstance(e, TrainctlError):
        say_error(f"error: {e}")
        return exit_code_for(e)
    if isinstance(e, KeyboardInterrupt):
        say_error("interrupted")
        return ExitCode.INTERRUPTED
    if isinstance(e, OSError) and e.errno is not None and e.filename is not None:
        # a file trainctl was told to use (a spec, a home) is missing or unreadable
        say_error(f"error: {e.filename}: {e.strerror}")
        return ExitCode.FAILED
    return internal_error()


def internal_error() -> int:
    """Keep the traceback in a file, say where, and return 70."""
    import tempfile  # noqa: PLC0415  (error path only: ~3 ms that no normal run pays)
    import traceback  # noqa: PLC0415  (error path only)

    fd, path = tempfile.mkstemp(prefix="trainctl-crash-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(traceback.format_exc())
    say_error(f"internal error (traceback in {path}); please report it")
    return ExitCode.INTERNAL
