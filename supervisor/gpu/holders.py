"""Who holds a GPU, found without trusting NVML's pids.

Inside containers NVML may report host pids (meaningless here) or none at all, so a GPU
holder is also found by its open file descriptors on the GPU's device node
(``/dev/nvidiaN``), by reading every ``/proc/<pid>/fd`` link we are allowed to read.
"""

from __future__ import annotations

import os


def find_holders(device_paths: dict[str, int]) -> dict[int, set[int]]:
    """Return {gpu index: pids that have the GPU's device node open}."""
    out: dict[int, set[int]] = {}
    if not device_paths:
        return out
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            index = device_paths.get(target)
            if index is not None:
                out.setdefault(index, set()).add(int(name))
    return out


def read_env_var(pid: int, key: str) -> str | None:
    """Return variable ``key`` from the initial environment of ``pid`` (None if absent)."""
    prefix = key.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


def classify_pid(pid: int, fd_holders: set[int]) -> str:
    """Say how far an NVML-reported pid can be trusted here.

    ``visible``: it has the GPU's device node open, so it is the process NVML means.
    ``absent``: no such pid here (typically a host pid seen from inside a container).
    ``unconfirmed``: a pid with that number exists here but holds no GPU device: inside a
    PID namespace it may be an unrelated process, so nothing is attributed to it.
    """
    if pid in fd_holders:
        return "visible"
    return "unconfirmed" if os.path.exists(f"/proc/{pid}") else "absent"
