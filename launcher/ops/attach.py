"""`attach`: connect to the terminal of a job started with ``--tty``, through its
supervisor's control socket (the frames are supervisor/tree/terminal.py's).

This module opens the connection and says, in one line, why one cannot be had; the
keyboard and the screen are the verb's (launcher/verbs/attach.py).
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from trainctl.launcher import backends
from trainctl.supervisor.errors import JobConflictError, NotRunningError, StateError, TrainctlError
from trainctl.supervisor.model import control, state
from trainctl.supervisor.model.phases import Phase
from trainctl.supervisor.model.reports import SlurmStopReport, StopReport
from trainctl.supervisor.records import JsonObject, record

from .jobs import current_phase, existing_job

CONNECT_TIMEOUT_S = 5.0
# `trainctl start` without --tty: what to do instead, named in the refusal
NO_TTY_HINT = (
    "start it with `trainctl start --tty ...` (or tty = true in its spec) to attach; "
    "`trainctl logs -f {name}` follows its output meanwhile"
)


@record(frozen=True)
class Attached:
    """An open connection to a job's terminal: frames from here on."""

    name: str
    sock: socket.socket
    run: int
    main_pid: int | None
    early: bytes = b""  # frame bytes read together with the reply line


def attach(home: Path, name: str, *, read_only: bool, size: tuple[int, int] | None) -> Attached:
    """Connect to job NAME's terminal; raise with one line when it cannot be had."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    if not (b := backends.of(st)).can.terminal:
        raise JobConflictError(f"job {name} runs under {b.title}: it has no terminal to attach to")
    phase = current_phase(jdir, st)
    if phase not in (Phase.RUNNING, Phase.STARTING, Phase.STOPPING):
        raise NotRunningError(f"job {name} is not running ({phase}): nothing to attach to")
    if not _spec_has_tty(jdir):
        raise JobConflictError(f"job {name} has no terminal: " + NO_TTY_HINT.format(name=name))
    try:
        sock = control.connect(jdir, CONNECT_TIMEOUT_S)
    except control.ControlUnavailableError as e:
        raise JobConflictError(f"job {name}: {e}; `trainctl status {name}` says more") from None
    rows, cols = size if size is not None else (None, None)
    ask = control.AttachAsk(read_only, rows, cols)
    try:
        sock.sendall(control.encode(ask.to_doc()))
        doc, early = read_reply_line(sock)
        reply = control.attach_reply(doc)
    except (OSError, ValueError, StateError, control.ControlUnavailableError) as e:
        sock.close()
        raise JobConflictError(f"job {name}: its supervisor did not answer ({e})") from None
    if not reply.ok:
        sock.close()
        if reply.no_tty:
            raise JobConflictError(f"job {name} has no terminal: " + NO_TTY_HINT.format(name=name))
        raise JobConflictError(f"job {name}: cannot attach: {reply.error}")
    sock.settimeout(None)
    run = reply.run if reply.run is not None else st.run
    return Attached(name, sock, run, reply.main_pid, early)


def read_reply_line(sock: socket.socket) -> tuple[JsonObject, bytes]:
    """The reply's JSON line, and the frames that came in the same read after it (the
    supervisor sends the screen to replay right behind its reply)."""
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise control.ControlUnavailableError("the supervisor closed the connection")
        buf += chunk
        if len(buf) > control.MAX_LINE:
            raise control.ControlUnavailableError("reply too long")
    line, _, rest = buf.partition(b"\n")
    return control.decode(line), rest


def _spec_has_tty(jdir: Path) -> bool:
    try:
        return state.read_spec(jdir).tty
    except StateError:
        return True  # let the supervisor, the authority on its run, say


def last_stop(home: Path, name: str) -> StopReport | SlurmStopReport | None:
    """The report of the stop that ended the run just watched (None: none, or unreadable)."""
    try:
        return state.read_state(existing_job(home, name)).last_stop
    except TrainctlError:
        return None


def still_served(home: Path, name: str) -> bool:
    """The job's run and its supervisor live: a connection it closed was this viewer's
    alone (dropped for lagging), not the supervisor's end."""
    with contextlib.suppress(TrainctlError, OSError):
        jdir = state.job_dir(home, name)
        st = state.read_state(jdir)
        return state.supervisor_alive(jdir, st) and not st.phase.ended
    return False
