"""Which mounts a run writes to, and which of them its systemd scope keeps mounted.

A GPU box keeps checkpoints on their own mount (/data, /scratch, NFS). At a host shutdown
systemd stops a run's scope side by side with those mounts unless the scope is ordered
after them: the checkpoint the job writes during its graceful stop then lands under the
mount point, and is lost. The scope's RequiresMountsFor= names the run's directories
(supervisor/linux/systemd.py); this module finds the ones left out, for `status` and `doctor`.
Standard library only: `status` reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainctl.supervisor.model.spec import Spec


def written_dirs(home: Path, jdir: Path, spec: Spec) -> list[str]:
    """The directories a run writes to: its cwd, the home, its logs, its checkpoints.

    A checkpoint glob's directory is the part before its first wildcard, from the cwd.
    """
    cwd = spec.cwd or "/"
    out = [cwd, str(home), str(jdir / "logs")]
    if spec.watch.checkpoint:
        pattern = os.path.join(cwd, spec.watch.checkpoint)
        fixed = pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
        out.append(os.path.dirname(fixed) or "/")
    return [os.path.normpath(p) for p in out]


def mount_points() -> list[str]:
    """Every mount point of this mount namespace, longest first."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = [_unescape(line.split()[4]) for line in f if len(line.split()) > 4]
    except OSError:
        return ["/"]
    return sorted(set(points), key=len, reverse=True)


def mount_of(path: str, points: list[str]) -> str:
    """The mount point that holds ``path`` (the longest one that is a prefix of it)."""
    real = os.path.realpath(path)
    for mp in points:
        if real == mp or real.startswith(mp.rstrip("/") + "/"):
            return mp
    return "/"


def uncovered(dirs: list[str], kept: tuple[str, ...]) -> list[str]:
    """The mounts (other than /) that ``dirs`` live on and ``kept`` does not keep."""
    points = mount_points()
    covered = {mount_of(p, points) for p in kept}
    out = []
    for d in dirs:
        mp = mount_of(d, points)
        if mp != "/" and mp not in covered and mp not in out:
            out.append(mp)
    return out


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
