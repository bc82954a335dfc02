"""Optional cgroup v2 placement of a job: the strongest net, plus atomic freeze and kill.

Detected, never assumed: the cgroup2 mount is read from /proc/self/mountinfo and the job's
group is created *below the supervisor's own cgroup* (which is what systemd delegation
makes writable for non-root users). Anything that fails falls back to signal mode; the
caller records which mode is in use so ``status`` can say it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

from .poll import poll_until

SUBDIR = "trainctl"


def mounts() -> list[tuple[str, str, Path, str]]:
    """Each mount of /proc/self/mountinfo: (fstype, root within it, mount point, options)."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, after = left.split(), right.split()
                if len(fields) >= 5 and after:
                    options = after[2] if len(after) > 2 else ""
                    out.append((after[0], fields[3], Path(fields[4]), options))
    except OSError:
        return []
    return out


@functools.cache
def find_mount() -> Path | None:
    """Return the cgroup2 mount point, or None when cgroup v2 is not mounted."""
    return next((point for fstype, _, point, _ in mounts() if fstype == "cgroup2"), None)


def own_cgroup() -> str | None:
    """Return this process's cgroup v2 path (the ``0::`` line), or None."""
    return of_pid("self")


def of_pid(pid: int | str) -> str | None:
    """The cgroup v2 path of process ``pid`` (the ``0::`` line), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return next((line[3:].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        return None


def relative(path: Path) -> str | None:
    """A cgroup directory as /proc/PID/cgroup names it (``/a/b``), or None off the mount."""
    mount = find_mount()
    if mount is None or not path.is_relative_to(mount):
        return None
    return "/" + str(path.relative_to(mount)) if path != mount else "/"


def create_job_cgroup(leaf: str) -> Path | None:
    """Create the job's cgroup and return its path; None if this machine does not allow it."""
    mount, own = find_mount(), own_cgroup()
    if mount is None or own is None:
        return None
    base = mount / own.lstrip("/") / SUBDIR
    path = base / leaf
    try:
        base.mkdir(exist_ok=True)
        path.mkdir()
    except OSError:
        return None
    # freeze and kill are the reason to be here: without both (kernel < 5.14) use signals.
    if not (path / "cgroup.kill").exists() or not (path / "cgroup.freeze").exists():
        remove(path)
        return None
    return path


def is_ours(path: Path) -> bool:
    """Tell whether ``path`` has the shape of a job cgroup trainctl creates.

    ``<cgroup2 mount>/<...>/trainctl/<leaf>``, absolute, without ``..``: a state file
    naming any other cgroup (a system slice, another user's job) must never get its
    processes frozen or killed.
    """
    mount = find_mount()
    if mount is None or not path.is_absolute() or ".." in path.parts:
        return False
    return path.is_relative_to(mount) and path.parent.name == SUBDIR and path != mount


def open_procs_fd(path: Path) -> int:
    """Open ``cgroup.procs`` for writing; the child writes ``0`` to it before exec."""
    return os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)


def move(path: Path, pid: int) -> bool:
    """Move process ``pid`` (all its threads) into the cgroup; False if the kernel refused
    (it exited, or this host does not let us: no delegation, another owner)."""
    try:
        with open(path / "cgroup.procs", "w") as f:
            f.write(str(pid))
    except OSError:
        return False
    return True


def read_pids(path: Path) -> list[int]:
    """Return the pids in the cgroup (empty if it is gone)."""
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def freeze(path: Path, timeout_s: float) -> bool:
    """Freeze every task in the cgroup; return True once the kernel reports it frozen."""
    try:
        (path / "cgroup.freeze").write_text("1")
    except OSError:
        return False
    frozen = poll_until(lambda: True if "frozen 1" in _events(path) else None, timeout_s, 0.005)
    return frozen is not None


def kill(path: Path) -> bool:
    """SIGKILL every task in the cgroup at once (frozen tasks die too)."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        return False
    return True


def thaw(path: Path) -> None:
    """Undo a freeze; harmless if the cgroup is gone."""
    with contextlib.suppress(OSError):
        (path / "cgroup.freeze").write_text("0")


def remove(path: Path) -> bool:
    """Remove the (empty) cgroup; return False if it is still busy or already gone."""
    try:
        path.rmdir()
    except OSError:
        return False
    return True


def remove_when_empty(path: Path, timeout_s: float = 1.0) -> bool:
    """Remove the cgroup once the kernel has let go of its last task (a moment after the
    last exit); True once it is gone."""
    gone = poll_until(lambda: True if remove(path) or not path.exists() else None, timeout_s, 0.01)
    return gone is not None


def _events(path: Path) -> str:
    try:
        return (path / "cgroup.events").read_text()
    except OSError:
        return ""
