"""Which checkpoint is complete, and at which step: judged by trainctl, from the format.

A resume from a half-written checkpoint is a known failure (HF transformers #35782 and
#35525; Megatron-LM #5281, where 44 restarts looped on one bad checkpoint), and the newest
file matching a glob is, while a save runs, exactly that one. So each candidate is judged
by what its format says about being finished, in this order:

- a completion marker written last by the trainer: ``<checkpoint>.complete`` beside a file
  or directory, or ``.complete`` inside a checkpoint directory (``trainer.py`` writes it;
  any trainer can: it is an empty file, written after the checkpoint is);
- a temporary name (``*.tmp``, ``*.part``, ``*.partial``, ``*~``, a leading ``.``, ``tmp*``,
  NeMo's ``-unfinished``): partial;
- a PyTorch DCP directory: complete with its ``.metadata`` (DCP writes it last);
- a Hugging Face Trainer ``checkpoint-N/``: complete with ``trainer_state.json`` (saved
  after the weights and optimizer);
- a zip-format ``torch.save`` file (``PK\\x03\\x04``): complete when its end-of-central-
  directory record is there (the zip writer's last bytes);
- a ``.safetensors`` file: complete when its 8-byte header size, header and the largest
  tensor end add up to the file's size;
- anything else: complete when its size and mtime held across two looks (one look is
  enough when nothing touched it for :data:`SETTLED_S`).

The step of a checkpoint comes from the trainer's own record where it is cheap to read:
its name (``step_000120``, ``checkpoint-120``, ``iter_120``, ``epoch=3-step=1200``,
``global_step120``), a completion marker that says it (``{"step": 120}``, as
``trainer.mark_complete(path, step=120)`` writes it), an HF folder's
``trainer_state.json`` ``global_step``; failing those, from the newest progress step
at the moment it was written (the caller gives that lookup), which is then marked
``step_estimated`` (shown with ``≈``: a lower bound).
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.supervisor.records import record

from .steps import timed_steps
from .tail import tail_lines

COARSE_CLOCK_S = 0.01  # how far an mtime may lag time.time() (step_at)
SETTLED_S = 2.0  # untouched this long: its size is as good as seen twice
SECOND_LOOK_S = 0.25  # the pause between two looks at a file written moments ago
MARKER = ".complete"
_EOCD = b"PK\x05\x06"
_EOCD_SEARCH = 65536 + 22  # the record sits within the last 64 KiB comment + its 22 bytes
_SAFETENSORS_HEADER_MAX = 100 << 20
# (patterns as text: `re` compiles each once, when a checkpoint is first judged)
_TEMP = r"(?i)(\.tmp|\.temp|\.part|\.partial|\.incomplete|~|-unfinished)$|^(\.|tmp)"
_STEP_PATTERNS = (
    r"(?i)(?:^|[^a-z])step[=_-]?(\d+)",  # step_000120, epoch=3-step=1200
    r"(?i)global_step[_-]?(\d+)",
    r"(?i)checkpoint[-_](\d+)",  # HF checkpoint-120
    r"(?i)iter(?:ation)?[=_-]?(\d+)",  # Megatron iter_0000120
    r"(?i)(?:^|[^a-z])it(\d+)",
)


@record(frozen=True)
class Verdict:
    """One checkpoint as judged: complete or not, why, and its step when known."""

    path: str
    complete: bool
    why: str  # the format that decided: "DCP .metadata", "zip end record", ...
    mtime: float
    size: int
    step: float | None = None
    step_estimated: bool = False  # the step is the progress lookup's, not the trainer's


def _own_step(path: str, is_dir: bool) -> float | None:
    """The step the trainer recorded itself: its name, its marker, HF's trainer_state."""
    step = step_of_name(path)
    if step is not None:
        return step
    records = [(path.rstrip("/") + MARKER, "step")]
    if is_dir:  # a marker inside; an HF folder named otherwise than checkpoint-N
        records = [(os.path.join(path, MARKER), "step"),
                   (os.path.join(path, "trainer_state.json"), "global_step")]  # fmt: skip
    for doc_path, key in records:
        try:
            with open(doc_path, "rb") as f:
                doc = json.loads(f.read(1 << 20) or b"null")
        except (OSError, ValueError):
            continue
        value = doc.get(key) if isinstance(doc, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def step_of_name(path: str) -> float | None:
    """The step a checkpoint's own name gives (its last matching part), else None."""
    parts = Path(path).parts[-3:]  # a DCP shard's folder may carry it: .../step_120/...
    for part in reversed(parts):
        stem = part.rsplit(".", 1)[0] if "." in part[1:] else part
        for rx in _STEP_PATTERNS:
            found = re.findall(rx, stem)
            if found:
                return float(int(found[-1]))
    return None


def _tree_size_mtime(path: str, leave_out: str = "") -> tuple[int, float]:
    """Total size and newest mtime of a directory's files (symlinks are not followed out
    of the tree); ``leave_out``: a file name whose own mtime does not count."""
    size, newest = 0, os.stat(path, follow_symlinks=False).st_mtime
    for root, dirs, files in os.walk(path, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in files:
            try:
                st = os.stat(os.path.join(root, name), follow_symlinks=False)
            except OSError:
                continue
            size += st.st_size
            if name not in (leave_out, MARKER):
                newest = max(newest, st.st_mtime)
    return size, newest


def _written_after(marker: str, mtime: float) -> bool:
    """``marker`` exists and was written no earlier than the data it vouches for (a
    checkpoint rewritten in place after its marker is being written again)."""
    try:
        return os.stat(marker).st_mtime >= mtime
    except OSError:
        return False


def _zip_complete(path: str, size: int) -> bool:
    """The end-of-central-directory record is whole and ends the file: 22 bytes from
    its signature, plus the comment length it states (torch.save writes none)."""
    with open(path, "rb") as f:
        f.seek(max(0, size - _EOCD_SEARCH))
        tail = f.read()
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        return False
    comment = int.from_bytes(tail[at + 20 : at + 22], "little")
    return at + 22 + comment == len(tail)


def _safetensors_complete(path: str, size: int) -> bool:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return False
        n = int.from_bytes(head, "little")
        if n > _SAFETENSORS_HEADER_MAX or 8 + n > size:
            return False
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return False
    ends = [
        int(t["data_offsets"][1])
        for k, t in header.items()
        if k != "__metadata__" and isinstance(t, dict) and "data_offsets" in t
    ]
    return 8 + n + max(ends, default=0) == size


def _by_format(path: str, is_dir: bool, size: int, mtime: float) -> tuple[bool, str] | None:
    """(complete, why) when the format decides; None when only stability can tell."""
    name = os.path.basename(path.rstrip("/"))
    inside = os.path.join(path, MARKER)
    if _written_after(path.rstrip("/") + MARKER, mtime) or (
        is_dir and _written_after(inside, mtime)
    ):
        return True, "completion marker"
    if re.search(_TEMP, name):
        return False, "a temporary name"
    return _dir_format(path, name) if is_dir else _file_format(path, name, size)


def _file_format(path: str, name: str, size: int) -> tuple[bool, str] | None:
    try:
        if name.endswith(".safetensors"):
            done = _safetensors_complete(path, size)
            return done, "safetensors header" if done else "safetensors shorter than its header"
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"PK\x03\x04":
            done = _zip_complete(path, size)
            return done, "zip end record" if done else "zip without its end record"
    except OSError:
        return False, "unreadable"
    return None


def _dir_format(path: str, name: str) -> tuple[bool, str] | None:
    meta = os.path.join(path, ".metadata")
    if os.path.exists(meta):
        # DCP writes .metadata last: shards newer than it are a save in progress, in place
        _, shards = _tree_size_mtime(path, leave_out=".metadata")
        done = _written_after(meta, shards)
        return done, "DCP .metadata" if done else "DCP shards newer than .metadata"
    if re.fullmatch(r"checkpoint-\d+", name):
        done = os.path.exists(os.path.join(path, "trainer_state.json"))
        return done, "HF trainer_state.json" if done else "HF checkpoint without trainer_state.json"
    if glob.glob(os.path.join(glob.escape(path), "*.distcp")):
        return False, "DCP shards without .metadata"
    return None


def judge(
    path: str, *, now: float | None = None, look_again: bool = True, quiet: bool = False
) -> Verdict | None:
    """Judge one checkpoint (a file or a directory); None when it is gone or unreadable.

    ``quiet``: nothing writes it any more (every process of the run is gone): its size is
    final, so a file of no known format needs no second look."""
    try:
        st = os.stat(path)  # a symlink to a checkpoint counts as that checkpoint
    except OSError:
        return None
    is_dir = os.path.isdir(path)
    try:
        size, mtime = _tree_size_mtime(path) if is_dir else (st.st_size, st.st_mtime)
    except OSError:
        return Verdict(path, False, "unreadable", st.st_mtime, 0, step_of_name(path))
    own = _own_step(path, is_dir)
    decided = _by_format(path, is_dir, size, mtime)
    if decided is None:
        settled = quiet or (now or time.time()) - mtime >= SETTLED_S
        if not settled and look_again:
            time.sleep(SECOND_LOOK_S)
            try:
                again = _tree_size_mtime(path) if is_dir else _size_mtime(path)
            except OSError:
                return None
            settled = again == (size, mtime)
        decided = (settled, "size held" if settled else "still being written")
    return Verdict(path, decided[0], decided[1], mtime, size, own)


def _size_mtime(path: str) -> tuple[int, float]:
    st = os.stat(path)
    return st.st_size, st.st_mtime


def newest_mtime(cwd: str, pattern: str) -> float | None:
    """The newest modification time among the paths ``pattern`` matches under ``cwd``
    (one glob and a stat each: the cheap look before a checkpoint is judged)."""
    best: float | None = None
    for path in glob.iglob(os.path.join(cwd, pattern), recursive=True):
        try:
            t = os.stat(path).st_mtime
        except OSError:
            continue
        if t and (best is None or t > best):
            best = t
    return best


def candidates(cwd: str, pattern: str) -> list[str]:
    """The paths ``pattern`` (relative to ``cwd``) matches, newest first; completion
    markers and the files of a checkpoint directory's own are not candidates."""
    found = []
    for path in glob.glob(os.path.join(cwd, pattern), recursive=True):
        if path.endswith(MARKER):
            continue
        try:
            found.append((os.stat(path).st_mtime, path))
        except OSError:
            continue
    return [p for _, p in sorted(found, reverse=True)]


@record(frozen=True)
class Newest:
    """The newest complete checkpoint, and a newer partial one if there is one."""

    complete: Verdict | None
    partial: Verdict | None


def newest(
    cwd: str,
    pattern: str,
    step_at: Callable[[float], float | None] | None = None,
    *,
    limit: int = 50,
) -> Newest:
    """The newest complete checkpoint matching ``pattern``; a newer partial one is named.

    ``step_at(mtime)`` gives the progress step at a moment, for a checkpoint whose name
    carries none. At most ``limit`` candidates are judged (newest first).
    """
    partial = None
    for path in candidates(cwd, pattern)[:limit]:
        v = judge(path)
        if v is None:
            continue
        if v.step is None and step_at is not None:
            at = step_at(v.mtime)
            v = Verdict(v.path, v.complete, v.why, v.mtime, v.size, at, at is not None)
        if v.complete:
            return Newest(v, partial)
        if partial is None:
            partial = v
    return Newest(None, partial)


def complete_ones(
    cwd: str,
    pattern: str,
    step_at: Callable[[float], float | None] | None = None,
    *,
    want: int = 2,
    limit: int = 50,
    quiet: bool = False,
) -> list[Verdict]:
    """The newest ``want`` complete checkpoints, newest first (a restart hands the newest;
    a run that failed right after resuming from it is retried once from the one before).
    ``quiet``: the run has stopped, nothing writes them (see :func:`judge`)."""
    out: list[Verdict] = []
    for path in candidates(cwd, pattern)[:limit]:
        v = judge(path, quiet=quiet)
        if v is None or not v.complete:
            continue
        if v.step is None and step_at is not None:
            at = step_at(v.mtime)
            v = Verdict(v.path, v.complete, v.why, v.mtime, v.size, at, at is not None)
        out.append(v)
        if len(out) >= want:
            break
    return out


def step_at(
    load: Callable[[], list[tuple[float, float]]],
) -> Callable[[float], float | None]:
    """The progress step at a moment over the (time, step) points ``load`` gives; they are
    read on the first look only (most checkpoints name their step, and `status` must not
    read a log's tail for nothing)."""
    loaded: list[list[tuple[float, float]]] = []

    def at(moment: float) -> float | None:
        if not loaded:
            loaded.append(sorted(load()))
        # an mtime is stamped from the kernel's coarse clock (up to a jiffy, <= 10 ms, behind
        # time.time()); more slack than that takes in the step logged just after the save
        # (a trainer stepping every 50 ms read one high), which a guard must never do
        before = [step for t, step in loaded[0] if t <= moment + COARSE_CLOCK_S]
        return before[-1] if before else None

    return at


def step_lookup(files: list[Path], tail_bytes: int = 256 << 10) -> Callable[[float], float | None]:
    """The progress step at a moment, from timed JSON lines (``t`` and ``step``): a run's
    $TRAINCTL_PROGRESS, or the supervisor's samples of a ``progress_regex`` step."""
    return step_at(lambda: [p for f in files for p in timed_steps(tail_lines(f, tail_bytes))])


def mark_complete(path: str) -> None:
    """Write the completion marker of ``path`` (after the checkpoint itself is written)."""
    target = os.path.join(path, MARKER) if os.path.isdir(path) else path + MARKER
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    os.close(fd)
