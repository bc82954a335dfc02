"""A run's code, kept under the job's directory so that a deploy has a way back.

``snapshot = "git"``: ``git worktree add --detach`` of the source's commit under
``<job>/snapshots/run-N``, then the source's uncommitted diff applied to it (untracked
files are not part of a commit and are not copied: the code record names them). The run
executes there, in the same subdirectory of the repository as its cwd.

``snapshot = "copy"``: a copy of the source directory, leaving out ``snapshot_exclude``;
a tree over ``snapshot_max`` is refused before anything is stopped or started.

``snapshot = "none"`` (the default): the run executes in place; nothing is kept, so a
deploy cannot roll back (it says so, and ``--rollback never`` is then implied). The default
stays "none" because a snapshot changes where the job runs: relative paths to data or
checkpoints outside the repository keep working, but a job that writes into its own tree
writes into the snapshot. A user asks for it, once, in the spec.

The newest ``snapshot_keep`` snapshots are kept per job (the running run's always); older
ones go at the next start and on ``trainctl prune``.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

from trainctl.supervisor.errors import ConfigError, JobNotFoundError, SpawnError, StateError
from trainctl.supervisor.model import state
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.records import replace

GIT_TIMEOUT_S = 120.0


def source_of(spec: Spec) -> str:
    """The directory whose code a new run takes: the snapshot's source, else the cwd."""
    return spec.source or spec.cwd


def snapshots_dir(jdir: Path) -> Path:
    return jdir / "snapshots"


def snapshot_path(jdir: Path, run: int) -> Path:
    return snapshots_dir(jdir) / f"run-{run}"


def _git(cwd: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", cwd, *args],
        input=stdin,
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )


def _toplevel(cwd: str) -> str | None:
    if shutil.which("git") is None:
        return None
    res = _git(cwd, "rev-parse", "--show-toplevel")
    return res.stdout.decode().strip() or None if res.returncode == 0 else None


def _excluded(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def tree_size(root: str, exclude: tuple[str, ...], cap: int) -> int:
    """Bytes in ``root`` without the excluded names; stops counting past ``cap``."""
    total = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _excluded(d, exclude)]
        for f in files:
            if _excluded(f, exclude):
                continue
            try:
                total += os.lstat(os.path.join(folder, f)).st_size
            except OSError:
                continue
            if total > cap:
                return total
    return total


def check(spec: Spec) -> None:
    """Refuse, in one line, a snapshot that cannot be taken (before anything is touched)."""
    policy, src = spec.snapshot, source_of(spec)
    if policy.mode == "git":
        if shutil.which("git") is None:
            raise ConfigError("snapshot = git: git is not installed here")
        if _toplevel(src) is None:
            raise ConfigError(f"snapshot = git: {src} is not in a git work tree (use copy)")
        if _git(src, "rev-parse", "--verify", "HEAD").returncode != 0:
            raise ConfigError(f"snapshot = git: the repository of {src} has no commit yet")
    elif policy.mode == "copy":
        size = tree_size(src, policy.exclude, policy.max_bytes)
        if size > policy.max_bytes:
            raise ConfigError(
                f"snapshot = copy: {src} holds more than {policy.max_bytes >> 20} MiB "
                "(snapshot_max); exclude what is not code (snapshot_exclude) or raise "
                "snapshot_max; nothing was changed"
            )


def make(jdir: Path, spec: Spec, run: int) -> Spec:
    """Take run ``run``'s snapshot; the spec that runs from it (``source`` set)."""
    policy, src = spec.snapshot, source_of(spec)
    if policy.mode == "none":
        return spec
    if policy.mode == "copy":
        check(spec)  # the size cap (git's checks: the worktree add says what is wrong)
    dest = snapshot_path(jdir, run)
    snapshots_dir(jdir).mkdir(mode=0o700, exist_ok=True)
    _remove(dest)
    if policy.mode == "git":
        top = _toplevel(src) or src
        _worktree(top, dest)
        cwd = dest / os.path.relpath(os.path.realpath(src), os.path.realpath(top))
        outside = _git_ignored(top)
    else:
        top = src
        ignore = shutil.ignore_patterns(*policy.exclude)
        shutil.copytree(src, dest, symlinks=True, ignore=ignore)
        cwd = dest
        outside = _copy_excluded(src, policy.exclude)
    os.chmod(dest, 0o700)  # copytree copies the source's mode, git makes it by the umask
    outside += _checkpoint_home(spec, src, top)
    link_outside(top, dest, outside)
    return replace(spec, cwd=str(cwd.resolve()), source=src)


# Never linked into a snapshot: the repository itself, and bytecode (a snapshot compiles
# its own; sharing the source's __pycache__ would mix two versions' caches)
_NEVER_LINKED = (".git", "__pycache__", "*.pyc")
MAX_LINKS = 10_000


def _git_ignored(top: str) -> list[str]:
    """The git-ignored files and folders of the work tree (a folder as one entry): the
    data, checkpoints, venvs and outputs that are in no commit, so in no worktree."""
    res = _git(top, "ls-files", "--others", "--ignored", "--exclude-standard", "--directory")
    if res.returncode != 0:
        return []
    return [p.rstrip("/") for p in res.stdout.decode(errors="replace").splitlines() if p]


def _copy_excluded(src: str, exclude: tuple[str, ...]) -> list[str]:
    """What `snapshot_exclude` left out of a copy, as paths relative to ``src`` (a folder
    as one entry)."""
    out = []
    for folder, dirs, files in os.walk(src):
        rel = os.path.relpath(folder, src)
        for name in [*dirs, *files]:
            if _excluded(name, exclude):
                out.append(os.path.normpath(os.path.join(rel, name)))
        dirs[:] = [d for d in dirs if not _excluded(d, exclude)]
        if len(out) > MAX_LINKS:
            break
    return out


def _checkpoint_home(spec: Spec, src: str, top: str) -> list[str]:
    """The folder a relative `checkpoint` glob writes to (``out`` of ``out/ckpt.pt``),
    made in the source when it is missing there and in no commit: the trainer's first
    save then lands where the user and the next run look, not in the snapshot."""
    pattern = spec.watch.checkpoint
    if not pattern or os.path.isabs(pattern):
        return []
    fixed = []
    for part in Path(pattern).parts[:-1]:
        if glob_magic(part):
            break
        fixed.append(part)
    if not fixed or fixed[0] == "..":
        return []
    folder = os.path.join(src, *fixed)
    rel = os.path.relpath(folder, top)
    if rel.startswith(".."):
        return []
    if not os.path.exists(folder):
        tracked = _git(top, "ls-files", "--error-unmatch", rel).returncode == 0
        if tracked:
            return []
        os.makedirs(folder, exist_ok=True)
    return [os.path.relpath(os.path.join(src, fixed[0]), top)]


def glob_magic(part: str) -> bool:
    return any(c in part for c in "*?[")


def link_outside(top: str, dest: Path, rel_paths: list[str]) -> list[str]:
    """Link each of ``rel_paths`` (relative to the source ``top``) into the snapshot at the
    same place, to the source's own path: a job reads its git-ignored data and writes its
    outputs by the same relative paths as without a snapshot, in the user's directories.
    A path the snapshot already has (tracked code) is never replaced. Returns the links."""
    made = []
    for rel in sorted(set(rel_paths))[:MAX_LINKS]:
        if (
            rel in (".", "")
            or rel.startswith("..")
            or any(_excluded(part, _NEVER_LINKED) for part in Path(rel).parts)
        ):
            continue
        link, target = dest / rel, os.path.join(top, rel)
        if os.path.lexists(link) or not os.path.lexists(target) or not link.parent.is_dir():
            continue
        os.symlink(target, link)
        made.append(rel)
    return made


def _worktree(top: str, dest: Path) -> None:
    """A detached worktree of HEAD at ``dest``, with the uncommitted diff applied.

    The diff is read while the worktree is checked out (both only read the repository):
    on a 30,000-file tree that is most of the difference to a bare `git worktree add`.
    """
    differ = subprocess.Popen(
        ["git", "-C", top, "diff", "HEAD", "--binary"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        res = _git(top, "worktree", "add", "--detach", "--quiet", str(dest), "HEAD")
        diff, _ = differ.communicate(timeout=GIT_TIMEOUT_S)
    finally:
        if differ.poll() is None:
            differ.kill()  # our own child, not yet reaped
            differ.wait()
    if res.returncode != 0:
        why = res.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise SpawnError(f"snapshot = git: git worktree add failed: {why[0]}")
    if diff:
        applied = _git(str(dest), "apply", "--whitespace=nowarn", stdin=diff)
        if applied.returncode != 0:
            _remove(dest)
            said = applied.stderr.decode(errors="replace").strip()[:200]
            raise SpawnError(f"snapshot = git: the uncommitted diff does not apply: {said}")


def _remove(path: Path) -> None:
    """Remove a snapshot directory (a git worktree is unregistered as well)."""
    if not path.exists() and not path.is_symlink():
        return
    git_file = path / ".git"
    if git_file.is_file():  # a worktree: tell its repository, then remove it
        common = _git(str(path), "rev-parse", "--git-common-dir").stdout.decode().strip()
        shutil.rmtree(path, ignore_errors=True)
        if common:
            _git(str(Path(path, common).resolve().parent), "worktree", "prune")
        return
    shutil.rmtree(path, ignore_errors=True)


def prune(jdir: Path, keep: int, in_use: set[int]) -> list[int]:
    """Remove all but the newest ``keep`` snapshots (never one in ``in_use``); the runs removed."""
    try:
        runs = sorted(
            int(p.name[4:])
            for p in snapshots_dir(jdir).iterdir()
            if p.name.startswith("run-") and p.name[4:].isdigit()
        )
    except FileNotFoundError:
        return []
    kept = set(runs[-keep:]) | in_use if keep > 0 else set(in_use)
    gone = [r for r in runs if r not in kept]
    for r in gone:
        _remove(snapshot_path(jdir, r))
    return gone


def trim(jdir: Path) -> list[int]:
    """`trainctl prune`: a job's snapshots beyond its ``snapshot_keep`` (never the current
    run's, nor the one it runs from); the runs whose snapshots were removed."""
    try:
        spec, st = state.read_spec(jdir), state.read_state(jdir)
    except (OSError, ValueError, StateError, JobNotFoundError):
        return []
    in_use = {st.run, run_of(spec, jdir) or st.run}
    return prune(jdir, max(spec.snapshot.keep, 1), in_use)


def run_of(spec: Spec, jdir: Path) -> int | None:
    """The run whose snapshot ``spec`` executes from (None: it runs in place)."""
    if spec.source is None:
        return None
    try:
        rel = Path(spec.cwd).resolve().relative_to(snapshots_dir(jdir).resolve())
    except ValueError:
        return None
    head = rel.parts[0] if rel.parts else ""
    return int(head[4:]) if head.startswith("run-") and head[4:].isdigit() else None
