"""Work a job handed to a tmux server outside it: found, said, never called proof.

A job that runs ``tmux -S SOCK new-session -d "python train.py"`` against a server that
was running before the job started hands its training to that server: the training is
then a child of the server, outside the job's tree, session, cgroup and marker, and no
net finds it. What can be seen is the job's own tmux client while it runs (``tmux
wait-for``, ``attach``, or a ``new-session`` caught in the act): its socket names the
server, and a server that is not a member of the job is foreign.

Reading a process's executable to decide what to *say* is fine; nothing here decides
what to signal (the foreign server and its children are never touched).
"""

from __future__ import annotations

import os

from trainctl.supervisor.gpu.holders import find_holders, read_env_var
from trainctl.supervisor.linux.procfs import read_argv
from trainctl.supervisor.records import record

_LISTENING = 0x00010000  # __SO_ACCEPTCON in /proc/net/unix's Flags column


@record(frozen=True)
class Handoff:
    """A job's tmux client talking to a tmux server outside the job."""

    client_pid: int
    server_pid: int | None  # None: the socket has no listener visible here
    socket: str

    def line(self) -> str:
        """What status and the stop report say (one line)."""
        server = f"pid {self.server_pid}" if self.server_pid else "not visible here"
        return (
            f"work handed to a tmux server outside the job (server {server}, socket "
            f"{self.socket}; the job's client pid {self.client_pid}): it is not stopped with "
            f"the job; `trainctl adopt NAME --tmux SESSION --tmux-socket {self.socket}` "
            "takes it over"
        )


def is_tmux(pid: int) -> bool:
    """Tell whether ``pid`` runs the tmux executable."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "tmux"
    except OSError:
        return False


_WITH_VALUE = "cfLST"  # tmux's own flags that take a value (tmux(1) SYNOPSIS)


def socket_of(pid: int) -> str | None:
    """The server socket a tmux client ``pid`` talks to: -S, -L, $TMUX, or the default."""
    argv = read_argv(pid)
    name = "default"
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("--", "-") or not arg.startswith("-"):
            break  # the tmux command starts: its own flags are not tmux's
        flag, rest = arg[1], arg[2:]
        if flag not in _WITH_VALUE:
            i += 1
            continue
        value = rest or (argv[i + 1] if i + 1 < len(argv) else "")
        i += 1 if rest else 2
        if flag == "S":
            return _absolute(pid, value)
        if flag == "L":
            name = value
    inside = read_env_var(pid, "TMUX")
    if name == "default" and inside:
        return inside.split(",", 1)[0]  # inside a tmux pane: that server
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    # tmux's own default directory (not a file of ours): $TMUX_TMPDIR, else /tmp
    tmpdir = read_env_var(pid, "TMUX_TMPDIR") or "/tmp"  # noqa: S108
    return f"{tmpdir}/tmux-{uid}/{name}"


def _absolute(pid: int, path: str) -> str:
    """``path`` as the client meant it: relative to its own working directory."""
    if os.path.isabs(path):
        return path
    try:
        return os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
    except OSError:
        return path


def find_handoffs(members: set[int]) -> list[Handoff]:
    """Every member that is a tmux client of a server that is not a member."""
    out = []
    for pid in sorted(members):
        if not is_tmux(pid):
            continue
        sock = socket_of(pid)
        if sock is None:
            continue
        server = _listener(sock)
        # a server the job started itself is one of its members: not a hand-off
        if (server is None or server not in members) and server != pid:
            out.append(Handoff(pid, server, sock))
    return out


def _listener(path: str) -> int | None:
    """The pid that listens on the Unix socket ``path`` (None: none visible here)."""
    inode = None
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for row in f:
                cols = row.split()
                if len(cols) >= 8 and cols[7] == path and int(cols[3], 16) & _LISTENING:
                    inode = cols[6]
                    break
    except OSError:
        return None
    if inode is None:
        return None
    # the same walk of /proc/*/fd that finds a GPU's holders by their device node
    holders = find_holders({f"socket:[{inode}]": 0}).get(0)
    return min(holders) if holders else None
