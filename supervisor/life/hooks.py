"""Hooks and notifications: what the supervisor hands to a hook runner for one event.

The supervisor calls :func:`fire` and goes on at once. The runner (supervisor/life/hookrun.py)
is a process of its own, so nothing here waits for a hook or for the network.

A hook's environment is the job's own plus::

    TRAINCTL_EVENT      exit | failure | stall | restart | checkpoint_stale
    TRAINCTL_JOB        the job's name (TRAINCTL_NAME too)
    TRAINCTL_RUN        the run number
    TRAINCTL_EXIT_CODE  main's exit code ('' while the run is live)
    TRAINCTL_CAUSE      the cause's kind (clean, stopped, exit, signal, oom, ...)
    TRAINCTL_REASON     the job's own reason (its exception), else the cause's summary
    TRAINCTL_SUMMARY    the cause's one line
    TRAINCTL_LOG        the run's log file
    TRAINCTL_LAST_LINES a file holding the log's last 50 lines
    TRAINCTL_HOST       the host the job runs on
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainctl.supervisor.model.reports import Cause
from trainctl.supervisor.model.schema import build_document
from trainctl.supervisor.model.spec import HOOK_EVENTS, Spec
from trainctl.supervisor.model.state import (
    HELPER_VAR,
    TRAINCTL_VARS,
    JobState,
    log_path,
    write_json_atomic,
)
from trainctl.supervisor.model.tail import shown_lines, tail_text
from trainctl.supervisor.records import JsonObject, asdict, field, record

LAST_LINES = 50
LINE_CHARS = 500
EVENTS = HOOK_EVENTS


@record(frozen=True)
class HookJob:
    """What the hook runner (hookrun.py, a process of its own) is handed for one event:
    written to a file by :func:`fire`, read back field by field by the runner."""

    jdir: str
    run: int
    event: str
    cwd: str
    timeout_s: float
    env: dict[str, str]
    argv: list[str] | None = None  # the hook's command, if the job has one for the event
    notify: str | None = None  # the URL to tell, if any
    doc: dict[str, Any] = field(default_factory=dict)  # the JSON the URL receives
    last_lines: list[str] = field(default_factory=list)

    def to_doc(self) -> JsonObject:
        """The JSON form the runner reads."""
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> HookJob:
        """Read a job back, checked field by field (a StateError names what is wrong)."""
        return build_document(cls, doc, where)


def last_lines(log: Path, n: int = LAST_LINES) -> list[str]:
    """The last ``n`` lines of the log (each cut to LINE_CHARS), cheaply."""
    text = tail_text(log, n * LINE_CHARS)
    return [x[:LINE_CHARS] for x in shown_lines(text)][-n:]


def document(
    event: str,
    spec: Spec,
    st: JobState,
    cause: Cause,
    progress: JsonObject | None,
    lines: list[str],
) -> JsonObject:
    """The JSON a notify URL receives: Slack (``text``), Discord (``content``) and ntfy
    (``title``, ``message``) read their own fields; everything else is for scripts."""
    host = socket.gethostname()
    summary = cause.summary or event
    title = f"trainctl: {spec.name} run {st.run} on {host}: {event}"
    end = st.ended_at or time.time()
    return {
        "text": f"{title}: {summary}",
        "content": f"{title}: {summary}",
        "title": title,
        "message": summary,
        "event": event,
        "job": spec.name,
        "host": host,
        "run": st.run,
        "cause": cause.kind,
        "summary": summary,
        "reason": cause.reason,
        "exit_code": st.exit_code if cause.exit_code is None else cause.exit_code,
        "duration_s": round(end - st.started_at, 3),
        "progress": progress,
        "last_lines": [*lines[-20:]],
        "ts": time.time(),
    }


def hook_env(event: str, spec: Spec, jdir: Path, st: JobState, cause: Cause) -> dict[str, str]:
    """The hook's environment: the job's own, trainctl's variables, and the event's."""
    env = {k: v for k, v in spec.env.items() if k not in TRAINCTL_VARS}
    code = st.exit_code if cause.exit_code is None else cause.exit_code
    env.update(
        TRAINCTL_EVENT=event,
        TRAINCTL_JOB=spec.name,
        TRAINCTL_NAME=spec.name,
        TRAINCTL_RUN=str(st.run),
        TRAINCTL_EXIT_CODE="" if code is None else str(code),
        TRAINCTL_CAUSE=cause.kind,
        TRAINCTL_REASON=cause.reason or cause.summary,
        TRAINCTL_SUMMARY=cause.summary,
        TRAINCTL_LOG=str(log_path(jdir, st.run)),
        TRAINCTL_HOST=socket.gethostname(),
    )
    env[HELPER_VAR] = st.marker  # a hook that daemonizes is still not a member of the job
    return env


def fire(
    event: str,
    spec: Spec,
    jdir: Path,
    st: JobState,
    cause: Cause,
    progress: JsonObject | None = None,
    *,
    notify: bool = True,
) -> str | None:
    """Start the runner for ``event`` if the job has a hook or a URL for it; never wait.

    ``notify`` False: run the hook but tell no URL (one message per end of a run).
    Returns why it could not be started (a full disk, no fork), else None.
    """
    hooks = spec.hooks
    argv = hooks.command(event)
    url = hooks.notify if notify else None
    if argv is None and url is None:
        return None
    lines = last_lines(log_path(jdir, st.run))
    doc = document(event, spec, st, cause, progress, lines)
    job = HookJob(
        jdir=str(jdir),
        run=st.run,
        event=event,
        cwd=spec.cwd,
        timeout_s=hooks.timeout_s,
        env=hook_env(event, spec, jdir, st, cause),
        argv=list(argv) if argv else None,
        notify=url,
        doc=doc,
        last_lines=lines,
    )
    try:
        _start_runner(jdir, job, st.marker)
    except OSError as e:
        return f"cannot start the {event} hook: {e.strerror}"
    return None


def _start_runner(jdir: Path, job: HookJob, marker: str) -> None:
    """Write the job to its file and start the runner on it, in a session of its own
    (reaped by the supervisor's reaper like any child). OSError: nothing is left."""
    folder = jdir / "hooks"
    path = folder / f"run-{job.run}.{job.event}.json"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(path, job.to_doc(), durable=False)
        with open(path, "rb") as stdin:
            env = {k: v for k, v in os.environ.items() if k not in TRAINCTL_VARS}
            env[HELPER_VAR] = marker
            subprocess.Popen(
                [sys.executable, "-m", "trainctl.supervisor.life.hookrun"],
                stdin=stdin,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=str(jdir),
                env=env,
                start_new_session=True,
                close_fds=True,
            )
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
