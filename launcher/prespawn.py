"""`trainctl start`'s supervisor, spawned before the rest of trainctl is imported.

A start ends when the job's main process has exec'd, and two interpreters stand between
the command and that moment: the CLI's (click, the spec, the records: ~110 ms here) and
then the supervisor's (its boot: ~65 ms), one after the other. For a start that names its
job (``[--home DIR] start ... --name NAME ...``) the console script forks the supervisor
here first, on the standard library's C parts only, with the very command line and
detachment the launch would give it (``python -m trainctl.supervisor --home HOME --name
NAME --fd K``: its own session, stdio on /dev/null, cwd /, no other fd). It imports its
boot on the other core while the CLI validates, and waits on its socket for the spec.

The launch hands the spec to it (:func:`take`) only when it is the one the launch would
spawn: the same home and name, no systemd scope (one wraps a new process; on a systemd
host nothing is spawned here), no lock handed over. In every other case, or when the
start is refused, the CLI closes its end (:func:`dismiss`, or its exit) and the waiting
supervisor, reading end of file before any byte, exits 0 having touched nothing.
"""

from __future__ import annotations

import _socket
import os
import sys

from trainctl.launcher import early
from trainctl.supervisor.model import layout

# At most one: (home, name, our end of the handshake socket, the supervisor's pid: our
# own child). A list, not a global rebound: spawned once, taken or dismissed once.
_standby: list[tuple[str, str, int, int]] = []


def spawn(argv: list[str]) -> None:
    """Fork the supervisor of ``argv``'s start now, if it names its job plainly."""
    if _standby or os.environ.get("TRAINCTL_HOST"):
        return  # --host through the environment: the start runs on that host
    home_opt, rest = (argv[1], argv[2:]) if argv[:1] == ["--home"] and argv[1:] else (None, argv)
    name = named(rest)
    if name is None or home_opt == "" or os.path.isdir("/run/systemd/system"):
        return  # systemd.booted(): the launch puts the supervisor in a scope it starts
    home = early.home_of(home_opt)
    if home is None:
        return
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    argv = [sys.executable, *layout.supervisor_args(home, name), "--fd", str(theirs.fileno())]
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return
    if pid == 0:
        _exec(argv, theirs.fileno())
    theirs.close()
    _standby.append((home, name, ours.detach(), pid))


def named(rest: list[str]) -> str | None:
    """The job name of a ``start`` command line (the verb first), or None where it names
    none, asks for help or runs under another backend: what click will make of it decides;
    a name misread here only costs the spawned supervisor (:func:`take` refuses it)."""
    if rest[:1] != ["start"]:
        return None
    name = None
    args = iter(rest[1:])
    for arg in args:
        if arg == "--":
            break
        if arg in ("-h", "--help", "--after") or arg.startswith("--after="):
            return None  # help, or always queued: the queue's waiter spawns its supervisor
        if arg.startswith("--backend=") and arg != "--backend=local":
            return None
        if arg in ("--name", "--backend"):
            value = next(args, None)
            if value is None or (arg == "--backend" and value != "local"):
                return None
            name = value if arg == "--name" else name
        elif arg.startswith("--name="):
            name = arg.removeprefix("--name=")
    return name if name is not None and layout.name_ok(name) else None


def take(home: str, name: str) -> tuple[int, int] | None:
    """The waiting supervisor's (socket fd, pid) for the launch of ``name`` in ``home``,
    handed over once; None when there is none, or it was spawned for another job."""
    if not _standby:
        return None
    if _standby[0][:2] != (home, name):
        dismiss()
        return None
    _, _, fd, pid = _standby.pop()
    return fd, pid


def dismiss() -> None:
    """Close the waiting supervisor's socket (it exits) and reap it, if it is done."""
    if not _standby:
        return
    _, _, fd, pid = _standby.pop()
    os.close(fd)
    try:  # noqa: SIM105  (contextlib is not loaded this early)
        os.waitpid(pid, os.WNOHANG)  # our own child; init reaps it if it is still going
    except ChildProcessError:
        pass


def _exec(argv: list[str], keep: int) -> None:
    """In the forked child: detach as the launch's Popen would, then exec the supervisor."""
    try:
        os.setsid()
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # close_fds: an ssh session's pipes too (close_range(2) where the kernel has it)
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        os.set_inheritable(keep, True)
        os.execv(argv[0], argv)  # noqa: S606  (the supervisor's argv, as the launch's)
    finally:
        os._exit(127)
