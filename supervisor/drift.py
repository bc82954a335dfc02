"""Code drift: which code a run started with, and whether what is on disk now differs.

Recorded at start: the git HEAD of the job's cwd, whether the tree was dirty and a hash
of the dirty diff, and a hash of the entry script when argv names a file. `status`
compares with the disk now and says "code changed on disk since start".
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from typing import Any

from .state import Spec

INTERPRETERS = {
    "python",
    "python3",
    "bash",
    "sh",
    "torchrun",
    "accelerate",
    "deepspeed",
    "uv",
    "poetry",
    "env",
}


def _git(cwd: str, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", cwd, *args], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.decode(errors="replace") if p.returncode == 0 else None


def entry_script(spec: Spec) -> str | None:
    """Return the script argv runs (python train.py -> train.py), or None."""
    for arg in spec.argv[:4]:
        if arg.startswith("-"):
            continue
        path = os.path.join(spec.cwd, arg)
        if os.path.basename(arg) in INTERPRETERS and not os.path.isfile(path):
            continue
        if os.path.isfile(path) and not os.path.basename(arg).startswith("python"):
            return os.path.abspath(path)
    return None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def code_version(spec: Spec) -> dict[str, Any]:
    """Return the code version of the job's cwd and entry script, as it is now."""
    out: dict[str, Any] = {}
    head = _git(spec.cwd, "rev-parse", "HEAD")
    if head is not None:
        diff = _git(spec.cwd, "diff", "HEAD") or ""
        out.update(git_head=head.strip(), dirty=bool(diff), diff_sha=_sha(diff.encode()))
    script = entry_script(spec)
    if script is not None:
        try:
            with open(script, "rb") as f:
                out.update(entry=script, entry_sha=_sha(f.read()))
        except OSError:
            pass
    return out


def drift(recorded: dict[str, Any] | None, spec: Spec) -> list[str]:
    """Return what changed since start (empty: nothing, or nothing was recorded)."""
    if not recorded:
        return []
    now = code_version(spec)
    changes = []
    if "git_head" in recorded and now.get("git_head") != recorded["git_head"]:
        changes.append(
            f"git HEAD {recorded['git_head'][:8]} -> {str(now.get('git_head', '?'))[:8]}"
        )
    elif "diff_sha" in recorded and now.get("diff_sha") != recorded["diff_sha"]:
        changes.append("uncommitted changes differ")
    if "entry_sha" in recorded and now.get("entry_sha") != recorded["entry_sha"]:
        changes.append(f"{os.path.basename(recorded['entry'])} edited")
    return changes
