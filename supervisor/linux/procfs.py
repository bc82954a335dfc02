"""Small, fast readers of /proc: the only place that parses its formats.

A process is identified by ``(pid, start_ticks)``: field 22 of ``/proc/<pid>/stat``, the
start time in clock ticks since boot. A pid alone is never trusted: it is recycled.
psutil is deliberately not used here: it costs ~20 ms to import, and ``trainctl status``
must stay well under 80 ms.
"""

from __future__ import annotations

import itertools
import os
import signal
from functools import cache

from trainctl.supervisor.records import record

PROC = "/proc"


@record(frozen=True, compiled=True)
class Stat:
    """The fields of /proc/<pid>/stat that trainctl uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    utime_ticks: int
    stime_ticks: int
    start_ticks: int
    rss_pages: int


def foreground_pgid(pid: int) -> int | None:
    """The foreground process group of ``pid``'s terminal (``tpgid``); None without one."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    try:
        tpgid = int(fields[5])
    except (IndexError, ValueError):
        return None
    return tpgid if tpgid > 0 else None


def read_stat(pid: int) -> Stat | None:
    """Return the parsed stat of ``pid``, or None when it does not exist (any more)."""
    # os-level I/O: half the cost of a buffered open() (a stop reads one per member)
    try:
        fd = os.open(f"{PROC}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        raw = os.read(fd, 4096)
    except ProcessLookupError:  # gone between open and read
        return None
    finally:
        os.close(fd)
    # comm may contain spaces and parentheses: split at the *last* ')'.
    head, _, tail = raw.rpartition(b")")
    comm = head.partition(b"(")[2].decode(errors="replace")
    fields = tail.split()
    # fields[0] is field 3 (state); field N is fields[N - 3].
    return Stat(
        pid=pid,
        comm=comm,
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        utime_ticks=int(fields[11]),
        stime_ticks=int(fields[12]),
        start_ticks=int(fields[19]),
        rss_pages=int(fields[21]),
    )


def list_pids() -> list[int]:
    """Return every pid currently in /proc (threads are not listed)."""
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def _environ(pid: int) -> list[bytes]:
    """Return the initial environment entries of ``pid`` ([] if unreadable or gone)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def has_marker(pid: int, needle: bytes) -> bool:
    """Tell whether the initial environment of ``pid`` contains ``needle`` (``b"K=V"``)."""
    # Entries are NUL-separated; match a whole entry, not a substring of another one.
    return needle in _environ(pid)


def has_marker_of_node(pid: int, needle: bytes, node_key: bytes, node: bytes) -> bool:
    """``needle`` is in the environment of ``pid``, and ``node_key`` (``b"K="``), if set
    there, says ``node``: one read of the environment."""
    env = _environ(pid)
    if needle not in env:
        return False
    return all(e == node_key + node for e in env if e.startswith(node_key))


def has_env_prefix(pid: int, prefixes: tuple[bytes, ...]) -> bool:
    """Tell whether an initial environment entry of ``pid`` starts with one of ``prefixes``."""
    return any(entry.startswith(prefixes) for entry in _environ(pid))


def _read(path: str) -> bytes | None:
    """Read a /proc file whole with os-level calls (a stop plan reads two per parent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except (ProcessLookupError, PermissionError):  # gone, or no longer ours to read
        return None
    finally:
        os.close(fd)


def read_argv(pid: int) -> list[str]:
    """Return the argument vector of ``pid`` ([] for zombies/kernel threads)."""
    raw = _read(f"{PROC}/{pid}/cmdline")
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []


def is_supervisor(pid: int, start_ticks: int) -> bool:
    """Tell whether (pid, start_ticks) is a live trainctl supervisor or Slurm node agent.

    A state file names its supervisor by pid and start time; a forged or stale one could
    name any process. Its children are members (the subreaper net) and `stop --force`
    kills it, so it must also *be* a supervisor: `python -m trainctl.supervisor[.node]`.
    """
    if not is_alive(pid, start_ticks):
        return False
    argv = read_argv(pid)
    modules = ("trainctl.supervisor", "trainctl.supervisor.node")
    return any(a == "-m" and b in modules for a, b in itertools.pairwise(argv))


def read_cmdline(pid: int) -> str:
    """Return the command line of ``pid`` joined by spaces ('' for zombies/kernel threads)."""
    return " ".join(read_argv(pid))


def read_wchan(pid: int) -> str:
    """Return the kernel function ``pid`` sleeps in ('' if unknown)."""
    try:
        with open(f"{PROC}/{pid}/wchan") as f:
            return f.read().strip() or ""
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def catches(pid: int, sig: int) -> bool:
    """Tell whether ``pid`` has a handler installed for ``sig`` (SigCgt in /proc status)."""
    return _sig_bit(pid, b"\nSigCgt:", sig)


def ignores(pid: int, sig: int) -> bool:
    """Tell whether ``pid`` ignores ``sig`` (SigIgn in /proc status): it will not act on it."""
    return _sig_bit(pid, b"\nSigIgn:", sig)


def _sig_bit(pid: int, key: bytes, sig: int) -> bool:
    raw = _read(f"{PROC}/{pid}/status")
    at = raw.find(key) if raw else -1
    if raw is None or at < 0:
        return False
    start = at + len(key)
    end = raw.find(b"\n", start)
    mask = raw[start : end if end >= 0 else None]
    try:
        return bool(int(mask, 16) >> (sig - 1) & 1)
    except ValueError:
        return False


@cache
def clock_ticks() -> int:
    """Return USER_HZ, the unit of the stat time fields."""
    return os.sysconf("SC_CLK_TCK")


@cache
def boot_time() -> float:
    """Return the boot time as a Unix timestamp."""
    with open(f"{PROC}/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def ticks_to_epoch(start_ticks: int) -> float:
    """Convert a stat start time to a Unix timestamp."""
    return boot_time() + start_ticks / clock_ticks()


def is_alive(pid: int, start_ticks: int) -> bool:
    """Tell whether the process ``(pid, start_ticks)`` exists and is not a zombie."""
    st = read_stat(pid)
    return st is not None and st.start_ticks == start_ticks and st.state not in ("Z", "X")


def exists(pid: int, start_ticks: int) -> bool:
    """Tell whether ``(pid, start_ticks)`` still holds its pid (zombies included)."""
    st = read_stat(pid)
    return st is not None and st.start_ticks == start_ticks


def send_signal(pid: int, start_ticks: int, sig: int) -> bool:
    """Signal ``(pid, start_ticks)`` through a pidfd; return False if it is not that process.

    The pidfd is opened *before* the start time is checked: if the check passes, the fd
    provably refers to the process we verified, so a pid recycled between the check and
    the signal cannot receive it (the race plain ``os.kill`` has).
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        return exists(pid, start_ticks) and signal_pidfd(fd, sig)
    finally:
        os.close(fd)


def signal_pidfd(fd: int, sig: int) -> bool:
    """Signal the process a pidfd holds; False if it has exited or is not ours to signal."""
    try:
        signal.pidfd_send_signal(fd, sig)
    except (ProcessLookupError, PermissionError):
        # EPERM: another user's process (a setuid helper in the job, a forged state);
        # the stop reports it as a survivor, naming its owner
        return False
    return True


def read_uid(pid: int) -> int | None:
    """Return the real uid of ``pid`` (None if it is gone)."""
    try:
        return os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """Return the children of ``pid`` from /proc/PID/task/*/children (no /proc walk)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"{PROC}/{pid}/task")
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return out
    for tid in tids:
        try:
            with open(f"{PROC}/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out
