"""Code drift: which code a run started with, and whether what is on disk now differs.

Recorded at start: the git HEAD of the job's cwd, whether the tree was dirty and a hash
of the dirty diff, and a hash of the entry script when argv names a file. `status`
compares with the disk now and says "code changed on disk since start".
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
from pathlib import Path

from trainctl.supervisor.errors import StateError
from trainctl.supervisor.model.sections import CodeRecord
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import write_bytes_atomic
from trainctl.supervisor.records import replace

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


_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _git(cwd: str, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", cwd, *args], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.decode(errors="replace") if p.returncode == 0 else None


def entry_script(spec: Spec) -> str | None:
    """Return the script argv runs, or None.

    ``python train.py`` -> train.py; ``torchrun --standalone --nproc-per-node 8 train.py``,
    ``accelerate launch --num_processes 2 train.py`` and ``deepspeed train.py`` -> train.py
    (the first argument that is a file, however many options come before it);
    ``python -m pkg.train`` -> pkg/train.py (or pkg/train/__main__.py) under the cwd, and
    ``python -m torch.distributed.run ... train.py`` -> train.py.
    """
    args = list(spec.argv)
    skip = -1
    for i, arg in enumerate(args):
        if i == skip:
            continue
        if arg == "-m" and i + 1 < len(args):
            found = _module_file(spec.cwd, args[i + 1])
            if found is not None:
                return found
            skip = i + 1  # a launcher module (torch.distributed.run): its script follows
            continue
        if arg.startswith("-"):
            continue
        path = os.path.join(spec.cwd, arg)
        name = os.path.basename(arg)
        if name in INTERPRETERS or name.startswith("python") or not os.path.isfile(path):
            continue
        return os.path.abspath(path)
    return None


def _module_file(cwd: str, module: str) -> str | None:
    base = os.path.join(cwd, *module.split("."))
    for candidate in (f"{base}.py", os.path.join(base, "__main__.py")):
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    return None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _git_head_fast(cwd: str) -> str | None:
    """Read HEAD without running git (loose or packed ref); None if not found this way."""
    d = os.path.abspath(cwd)
    while True:
        git = os.path.join(d, ".git")
        if os.path.isdir(git):
            break
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent
    try:
        with open(os.path.join(git, "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        try:
            with open(os.path.join(git, ref)) as f:
                return f.read().strip()
        except FileNotFoundError:
            with open(os.path.join(git, "packed-refs")) as f:
                for line in f:
                    if line.rstrip().endswith(" " + ref):
                        return line.split()[0]
    except OSError:
        return None
    return None


MAX_DIFF_KEPT = 1 << 20  # the uncommitted diff kept with a run, at most
MAX_UNTRACKED = 50
LOCK_FILES = ("uv.lock", "poetry.lock", "requirements.txt")


def code_version(spec: Spec, diff_to: Path | None = None) -> CodeRecord | None:
    """Return the code version of the job's cwd and entry script, as it is now (None:
    neither a git work tree nor an entry script, nothing to compare against later).

    ``diff_to``: where to keep the uncommitted diff itself, when it is at most
    MAX_DIFF_KEPT (its hash is always recorded).
    """
    entry, entry_sha = code_version_entry(spec)
    lock = _lock_file(spec.cwd)
    code = CodeRecord(
        entry=entry,
        entry_sha=entry_sha,
        lock_file=lock,
        lock_sha=_file_sha(lock) if lock else None,
        snapshot=None if spec.snapshot.mode == "none" else spec.snapshot.mode,
        tree_sha=tree_sha(spec) if spec.snapshot.mode == "copy" else None,
    )
    tree = spec.cwd
    head = _git(tree, "rev-parse", "HEAD")
    if head is None and spec.snapshot.mode == "copy" and spec.source:
        # a copy has no .git: the commit it was copied from is its source's (moments ago,
        # at the start), and so is the diff it carried over
        tree = spec.source
        head = _git(tree, "rev-parse", "HEAD")
    if head is not None:
        diff = _git(tree, "diff", "HEAD") or ""
        # untracked files are in no commit, so never in a git snapshot: named from the source
        where = spec.source or spec.cwd
        others = (_git(where, "ls-files", "--others", "--exclude-standard") or "").split("\n")
        others = [o for o in others if o]
        code = replace(
            code,
            git_head=head.strip(),
            dirty=bool(diff),
            diff_sha=_sha(diff.encode()),
            untracked=tuple(others[:MAX_UNTRACKED]),
            untracked_more=max(0, len(others) - MAX_UNTRACKED),
            diff_file=_keep_diff(diff, diff_to),
        )
    return code if code.recorded else None


def _keep_diff(diff: str, path: Path | None) -> str | None:
    if not diff or path is None or len(diff) > MAX_DIFF_KEPT:
        return None
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        write_bytes_atomic(path, diff.encode(), durable=False)  # 0600 whatever the umask
    except (OSError, StateError):
        return None
    return str(path)


def _lock_file(cwd: str) -> str | None:
    """The dependency lock of the job's directory: uv.lock, poetry.lock, requirements*.txt."""
    for name in LOCK_FILES:
        if os.path.isfile(os.path.join(cwd, name)):
            return os.path.join(cwd, name)
    try:
        reqs = sorted(
            n for n in os.listdir(cwd) if n.startswith("requirements") and n.endswith(".txt")
        )
    except OSError:
        return None
    return os.path.join(cwd, reqs[0]) if reqs else None


def _file_sha(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return _sha(f.read())
    except OSError:
        return None


def tree_sha(spec: Spec) -> str:
    """The identity of what a copy snapshot takes: every file of the source (its cwd)
    outside ``snapshot_exclude``, by relative name, size and mtime (a stat each, not a
    read: drift looks at it once a minute; an edit changes the mtime)."""
    root = spec.source or spec.cwd
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _matches(d, spec.snapshot.exclude))
        for name in sorted(files):
            if _matches(name, spec.snapshot.exclude):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            rel = os.path.relpath(path, root)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode(errors="replace"))
    return h.hexdigest()


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def code_version_entry(spec: Spec) -> tuple[str | None, str | None]:
    """Return the entry script and its hash, when argv names a file."""
    script = entry_script(spec)
    if script is None:
        return None, None
    try:
        with open(script, "rb") as f:
            return script, _sha(f.read())
    except OSError:
        return None, None


def drift(recorded: CodeRecord | None, spec: Spec) -> list[str]:
    """Return what changed since start (empty: nothing, or nothing was recorded).

    Content counts, not commits: HEAD is read from .git directly, and `git diff` of the
    start commit against the working tree is what start recorded exactly when the tracked
    files hold the same bytes (a commit of the very changes the run started with, an
    empty commit, an amend with nothing new: not a change).
    """
    if recorded is None or not recorded.recorded:
        return []
    if spec.source is not None:  # it runs from a snapshot: the source is what may change
        spec = replace(spec, cwd=spec.source)
    changes = []
    if recorded.git_head is not None:
        head = _git_head_fast(spec.cwd) or (_git(spec.cwd, "rev-parse", "HEAD") or "").strip()
        if head == recorded.git_head:
            if _sha((_git(spec.cwd, "diff", "HEAD") or "").encode()) != recorded.diff_sha:
                changes.append("uncommitted changes differ")
        else:
            start = recorded.git_head
            # a commit id only (never an option): None when it is gone (rebased, gc'd)
            since = _git(spec.cwd, "diff", start) if _COMMIT.fullmatch(start) else None
            if since is None or _sha(since.encode()) != recorded.diff_sha:
                changes.append(f"git HEAD {start[:8]} -> {head[:8] or '?'}")
    if recorded.tree_sha is not None and tree_sha(spec) != recorded.tree_sha:
        changes.append("files of the copied tree changed")
    if recorded.entry_sha is not None:
        _, now_sha = code_version_entry(spec)
        if now_sha != recorded.entry_sha:
            changes.append(f"{os.path.basename(recorded.entry or '?')} edited")
    return changes


def fingerprint(spec: Spec) -> tuple[int, ...]:
    """Cheap signs that the code may have changed: mtimes of git's HEAD, index and refs,
    and of the entry script. A commit, checkout, pull, `git add` or an edit of the entry
    script changes one of them; the supervisor recomputes the drift only then (and once a
    minute, for edits of other tracked files, which touch no file under .git)."""
    if spec.source is not None:
        spec = replace(spec, cwd=spec.source)
    paths = [entry_script(spec) or ""]
    d = os.path.abspath(spec.cwd)
    while True:
        git = os.path.join(d, ".git")
        if os.path.isdir(git):
            paths += [os.path.join(git, n) for n in ("HEAD", "index", "packed-refs", "refs/heads")]
            break
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    out = []
    for p in paths:
        try:
            out.append(os.stat(p).st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)
