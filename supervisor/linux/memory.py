"""A cap on a job's memory, and the names of what the kernel's OOM killer took.

Where the memory controller lives is detected, never assumed:

- **cgroup v2 with memory** (current GPU servers): the job's own cgroup (supervisor/linux/cgroup.py)
  gets ``memory.max`` and ``memory.high``, once the controller is enabled down to it.
- **hybrid hosts** (older distributions, and the machines this project is built on): v2 has
  no memory controller and memory is a v1 hierarchy (``/sys/fs/cgroup/memory``). The job
  then gets a second group there, ``<own v1 group>/trainctl/<leaf>``, with
  ``memory.limit_in_bytes`` and ``memory.soft_limit_in_bytes``; main enters it before exec,
  exactly as it enters the v2 group, so every process it starts is inside both.

The kernel counts OOM kills per group (v2 ``memory.events``, v1 ``memory.oom_control``:
``oom_kill N``). Which process it killed is only in the kernel log: ``/dev/kmsg`` is read
where it is readable (root, most containers as root), else the victim is named only when
it is main itself (its exit status says SIGKILL).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

from trainctl.supervisor.errors import SpawnError
from trainctl.supervisor.records import record

from . import cgroup as cg

SUBDIR = cg.SUBDIR
MIN_BYTES = 1 << 20  # below 1 MiB a job cannot even exec its interpreter


@record(frozen=True)
class Home:
    """Where job memory groups go: ``base`` is the ``trainctl`` folder holding them."""

    version: int  # 2 or 1
    base: Path


def _v1_mount() -> Path | None:
    """The v1 hierarchy that holds the memory controller (mounted at its root), or None."""
    for fstype, root, point, options in cg.mounts():
        if fstype == "cgroup" and root == "/" and "memory" in options.split(","):
            return point
    return None


def _own_v1() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    return path
    except (OSError, ValueError):
        return None
    return None


def _v2_has_memory() -> Path | None:
    mount, own = cg.find_mount(), cg.own_cgroup()
    if mount is None or own is None:
        return None
    here = mount / own.lstrip("/")
    try:
        controllers = (here / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    return here if "memory" in controllers else None


def find_home() -> Home | str:
    """Where a memory cap can be set on this host, or one line saying why it cannot."""
    v2 = _v2_has_memory()
    if v2 is not None:
        if not os.access(v2, os.W_OK):
            return f"the memory controller's cgroup {v2} is not writable by you"
        return Home(2, v2 / SUBDIR)
    mount, own = _v1_mount(), _own_v1()
    if mount is None or own is None:
        return "this host has no cgroup memory controller (neither v2 nor v1)"
    here = mount / own.lstrip("/")
    base = here / SUBDIR
    if not os.access(base if base.is_dir() else here, os.W_OK):
        return f"the memory cgroup {here} is not writable by you (run as root, or delegate it)"
    return Home(1, base)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _enable_v2(job: Path) -> None:
    """Enable the memory controller in every group between ours and the job's."""
    for parent in (job.parent.parent, job.parent):
        ctl = parent / "cgroup.subtree_control"
        if "memory" in ctl.read_text().split():
            continue
        try:
            _write(ctl, "+memory")
        except OSError as e:
            if e.errno == errno.EBUSY:
                raise SpawnError(
                    f"cannot enable the memory controller in {parent}: it holds processes "
                    "itself (cgroup v2's no-internal-processes rule); run trainctl from a "
                    "systemd scope or as root"
                ) from None
            raise


def place(spec_max: int | None, spec_high: int | None, leaf: str, job_cgroup: Path | None) -> Path:
    """Set the caps up for a run about to start; return the group holding its memory files.

    v2: the job cgroup itself (it must exist). v1: a new group, which the caller has main
    enter before exec (``open_procs_fd``). Raises SpawnError with one line if it cannot.
    """
    home = find_home()
    if isinstance(home, str):
        raise SpawnError(f"memory_max/memory_high cannot be set: {home}")
    if job_cgroup is None:
        raise SpawnError(
            "memory_max/memory_high need the job's own cgroup, and this run is in signals mode"
        )
    try:
        if home.version == 2:
            _enable_v2(job_cgroup)
            group = job_cgroup
            if spec_high is not None:
                _write(group / "memory.high", str(spec_high))
            if spec_max is not None:
                _write(group / "memory.max", str(spec_max))
            return group
        home.base.mkdir(exist_ok=True)
        group = home.base / leaf
        group.mkdir()
        try:
            if spec_max is not None:
                _write(group / "memory.limit_in_bytes", str(spec_max))
            if spec_high is not None:
                _write(group / "memory.soft_limit_in_bytes", str(spec_high))
        except OSError:
            cg.remove(group)
            raise
    except OSError as e:
        raise SpawnError(f"cannot set the job's memory cap: {e.strerror}") from None
    return group


def is_ours(path: Path) -> bool:
    """Tell whether ``path`` has the shape of a memory group trainctl makes (never trust more)."""
    if not path.is_absolute() or ".." in path.parts or path.parent.name != SUBDIR:
        return False
    mounts = [m for m in (cg.find_mount(), _v1_mount()) if m is not None]
    return any(path.is_relative_to(m) and path != m for m in mounts)


def separate(group: Path | None, job_cgroup: Path | None) -> Path | None:
    """The v1 group that main must enter besides the v2 one (None when they are the same)."""
    return group if group is not None and group != job_cgroup else None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@record(frozen=True)
class Usage:
    """What the memory group says now."""

    used_bytes: int | None
    max_bytes: int | None
    high_bytes: int | None
    oom_kills: int


_UNLIMITED = 1 << 62  # v1 reports "no limit" as a huge page-aligned number


def _limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    with contextlib.suppress(ValueError):
        value = int(text)
        return None if value >= _UNLIMITED else value
    return None


def usage(group: Path) -> Usage:
    """The group's use, its caps and its OOM kill count (zeros where it is gone)."""
    if (group / "memory.max").exists() or (group / "memory.current").exists():
        return Usage(
            _read_int(group / "memory.current"),
            _limit(group / "memory.max"),
            _limit(group / "memory.high"),
            oom_kills(group),
        )
    return Usage(
        _read_int(group / "memory.usage_in_bytes"),
        _limit(group / "memory.limit_in_bytes"),
        _limit(group / "memory.soft_limit_in_bytes"),
        oom_kills(group),
    )


def oom_kills(group: Path) -> int:
    """How many processes the kernel's OOM killer took from the group so far."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (group / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                with contextlib.suppress(ValueError):
                    return int(value)
    return 0


# "oom-kill:constraint=...,oom_memcg=/a/b,task_memcg=/a/b,task=python3,pid=1234,uid=0"
# (patterns as text: `re` compiles each once, on the first kernel log read, not at import)
_OOM_LINE = r"oom-kill:.*?task_memcg=(?P<memcg>[^,]*),task=(?P<task>.*),pid=(?P<pid>\d+)"
# "Memory cgroup out of memory: Killed process 1234 (python3) total-vm:..." (older kernels)
_KILLED = r"(?:Killed|Kill) process (?P<pid>\d+) \((?P<task>[^)]*)\)"
KMSG_RECORDS = 20000  # the ring buffer holds a few thousand records; never read forever


@record(frozen=True)
class Victim:
    """A process the kernel's OOM killer took."""

    pid: int
    comm: str


def oom_victims(pids: set[int], leaf: str | None) -> list[Victim]:
    """The OOM kills in the kernel log of a job's process (by pid or by its group's name).

    Empty where /dev/kmsg cannot be read (not root, a container without it).
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    found: dict[int, Victim] = {}
    try:
        for _ in range(KMSG_RECORDS):
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while we read: go on
                    continue
                break
            text = raw.decode(errors="replace").partition(";")[2]
            m = re.search(_OOM_LINE, text)
            if m is not None:
                pid = int(m["pid"])
                memcg = m["memcg"].rstrip("/")
                if pid in pids or (leaf and memcg.endswith(f"/{SUBDIR}/{leaf}")):
                    found[pid] = Victim(pid, m["task"])
                continue
            k = re.search(_KILLED, text)
            if k is not None and int(k["pid"]) in pids:
                found[int(k["pid"])] = Victim(int(k["pid"]), k["task"])
    finally:
        os.close(fd)
    return list(found.values())


def remove(group: Path | None, job_cgroup: Path | None) -> None:
    """Remove a run's v1 memory group once empty (the v2 one is the job cgroup itself)."""
    sep = separate(group, job_cgroup)
    if sep is not None and is_ours(sep):
        cg.remove_when_empty(sep, timeout_s=1.0)
