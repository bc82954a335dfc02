"""`logs`: a run's log, its last lines read from the end, and following it across restarts."""

from __future__ import annotations

import bisect
import codecs
import contextlib
import itertools
import os
import select
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from trainctl.launcher import backends
from trainctl.supervisor.errors import ConfigError, StateError
from trainctl.supervisor.model import nodefiles as nf
from trainctl.supervisor.model import state
from trainctl.supervisor.model.state import Phase
from trainctl.supervisor.model.tail import last_lines_at, read_from
from trainctl.supervisor.records import record
from trainctl.supervisor.tree.proctree import scan, target_of
from trainctl.supervisor.watch.logtimes import read_stamps

from .jobs import current_phase, existing_job

T = TypeVar("T")
LINE_BACK = 1 << 20  # --since reads this far before its first stamp for the line it is in


def log_lines(
    home: Path,
    name: str,
    run: int | None,
    tail: int | None,
    *,
    node: str | None = None,
    upto: int | None = None,
) -> tuple[Path, list[str]]:
    """Return the log path of run ``run`` (default: current) and its last ``tail`` lines.

    ``tail`` None means the whole log; 0 means no line (as ``tail -n 0``). ``node``: the
    log of that node of a multi-node Slurm job (the first node's is the run's own log).
    ``upto``: none of the bytes from that offset on (`logs -f` follows from there).
    """
    path = run_log(home, name, run, node=node)
    _, data = _read(path, tail, upto=upto)
    return path, _last(newline_lines(data.decode(errors="replace")), tail)


def run_log(home: Path, name: str, run: int | None, *, node: str | None = None) -> Path:
    """The log file of run ``run`` of job NAME (default: current; a Slurm node's)."""
    jdir = existing_job(home, name)
    st = state.read_state(jdir)
    run = st.run if run is None else run
    if run < 1 or run > st.run:
        raise ConfigError(f"job {name} has runs 1..{st.run}, not {run}")
    path = state.log_path(jdir, run)
    if node is not None:
        path = _node_log(jdir, run, node)
    if path.is_symlink():  # trainctl writes its logs itself: a link is someone's trap
        raise StateError(f"{path} is a symlink; refusing to follow it")
    return path


def _last(lines: list[T], tail: int | None) -> list[T]:
    if tail is None:
        return lines
    return lines[max(0, len(lines) - tail) :] if tail else []  # fewer lines than asked: all


def _read(
    path: Path, tail: int | None, since_offset: int = 0, upto: int | None = None
) -> tuple[int, bytes]:
    """(offset, data): the whole log, its last ``tail`` lines, or what follows an offset;
    with ``upto``, only what lies before that offset."""
    try:
        if tail is None:
            offset, data = since_offset, read_from(path, since_offset)
        else:
            offset, data = last_lines_at(path, tail)
    except FileNotFoundError:
        return 0, b""
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from None
    return offset, data if upto is None else data[: max(0, upto - offset)]


@record(frozen=True)
class FollowFrom:
    """Where a follow goes on: a byte of the log, and its newest rotated copy then (None:
    none), so that rotations after it are read from their copies."""

    pos: int
    copy: tuple[int, ...] | None

    @classmethod
    def now(cls, path: Path) -> FollowFrom:
        """The log's end now: for a caller that prints the log up to ``pos`` first."""
        copy = _identity(_copy_path(path, 1))
        try:
            return cls(path.stat().st_size, copy)
        except FileNotFoundError:
            return cls(0, copy)


START = FollowFrom(0, None)  # a run's log from its first byte, through every copy of it


def timed_lines(
    path: Path, tail: int | None, since: float | None, upto: int | None = None
) -> list[tuple[float | None, str]]:
    """The log's lines, each with the time it was written (supervisor/watch/logtimes.py; None:
    after the last look): its last ``tail`` lines, of those written at ``since`` or later
    (before ``upto``, as :func:`log_lines`)."""
    stamps = read_stamps(path)
    start = 0
    if since is not None:
        if not stamps.times:
            raise ConfigError(f"{path} has no times (a run from before they were recorded)")
        i = bisect.bisect_left(stamps.times, since)
        start = max(0, stamps.sizes[i - 1] - LINE_BACK) if i > 0 else 0
    offset, data = _read(path, None if since is not None else tail, start, upto)
    pieces = data.split(b"\n")
    if offset > 0 and since is not None:  # read from inside a line: not a whole one
        offset += len(pieces.pop(0)) + 1
    out: list[tuple[float | None, str]] = []
    for k, piece in enumerate(pieces):
        line = piece + b"\n" if k < len(pieces) - 1 else piece
        if not line:
            continue
        offset += len(line)
        at = stamps.time_of(offset)
        if since is None or at is None or at >= since:
            out.append((at, line.decode(errors="replace")))
    return _last(out, tail)


def newline_lines(text: str) -> list[str]:
    """The lines of ``text``, each with its newline, split at newlines only (as `tail -n`):
    a progress bar's carriage returns stay inside its line."""
    pieces = text.split("\n")
    last = pieces.pop()  # after the final newline: '' or a line not ended yet
    return [p + "\n" for p in pieces] + ([last] if last else [])


def other_nodes(home: Path, name: str, run: int | None) -> tuple[str, list[str]] | None:
    """For a multi-node run: the node whose log is the run's own log, and the others
    (each has its own log, `logs --node NODE`); None for a run on one node."""
    jdir = existing_job(home, name)
    records = nf.read_records(jdir, state.read_state(jdir).run if run is None else run)
    if len(records) < 2:
        return None
    first = next((r.node for r in records if nf.first_node(r)), records[0].node)
    return first, [r.node for r in records if r.node != first]


def _node_log(jdir: Path, run: int, node: str) -> Path:
    """The log file node ``node`` writes (the first node's is the run's own log)."""
    records = {r.node: r for r in nf.read_records(jdir, run)}
    if node not in records:
        known = ", ".join(sorted(records)) or "none reported yet"
        raise ConfigError(f"run {run} of job {jdir.name} has no node {node!r} (nodes: {known})")
    return nf.node_log_path(jdir, run, node, first=nf.first_node(records[node]))


def reader_gone(fd: int = 1) -> bool:
    """Tell whether nobody reads ``fd`` any more (ssh gone, `| head` done)."""
    p = select.poll()
    p.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))


def follow(
    home: Path,
    name: str,
    path: Path,
    poll_s: float,
    start: FollowFrom | None = None,
    on_gap: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """Yield new log text as it appears, switching to the next run's log after a restart.

    From ``start`` on (where the caller's own read of the log stopped: nothing written
    between that read and this one is lost), else from the log's end now. ``on_gap`` is
    told, between two chunks, when the log rotated faster than it was read and the copy
    holding the lines between them was removed (more than ``log_keep`` rotations).
    Ends when the job has finished and its log is drained: the run is over (or its
    supervisor is lost and no process of it is left) and nobody holds the job lock to
    restart it.
    """
    jdir = existing_job(home, name)
    readers = [_LogReader(path, start or FollowFrom.now(path))]  # each run's, in turn
    try:
        yield from _follow(jdir, name, readers, poll_s, on_gap)
    finally:
        for r in readers:  # the copies still open to be read
            r.close()


def _follow(
    jdir: Path,
    name: str,
    readers: list[_LogReader],
    poll_s: float,
    on_gap: Callable[[str], None] | None,
) -> Iterator[str]:
    """:func:`follow`'s loop; a later run's reader is appended to ``readers``."""
    run = int(readers[0].path.stem.split("-")[-1])
    end = _End(jdir, run)
    while True:
        reader = readers[-1]
        chunk = _read_telling(reader, on_gap)
        if chunk:
            yield chunk
            continue
        if state.log_path(jdir, run + 1).exists():  # made at its spawn: a later run
            run += 1
            readers.append(_LogReader(state.log_path(jdir, run), START))
            end = _End(jdir, run)
            yield f"==> {name} run {run} <==\n"
            continue
        if end.finished() and not state.is_locked(jdir, state.JOB_LOCK):
            if state.log_path(jdir, run + 1).exists():
                continue  # relaunched meanwhile: follow it
            while last := reader.read(final=True):  # the rest (a copy made at the end too)
                yield last
            return
        if reader_gone():
            # e.g. `trainctl --host X logs -f` after Ctrl-C: ssh is gone; do not linger
            return
        time.sleep(poll_s)


def _read_telling(reader: _LogReader, on_gap: Callable[[str], None] | None) -> str:
    """The reader's next text; ``on_gap`` told first when lines rotated away unread."""
    gaps = reader.gaps
    chunk = reader.read()
    if reader.gaps > gaps and on_gap is not None:
        on_gap(
            f"{reader.path.name} rotated faster than this follow read it: lines before "
            "the next ones may have gone with its oldest kept copy (log_keep)"
        )
    return chunk


class _End:
    """Whether run ``run`` is over for `logs -f`: ended for good as its backend's watch
    says (the supervisor's events; the scheduler: a relaunch's backoff is not an end), or,
    with its supervisor gone (lost), no process of it left.
    state.json is read once; the supervisor's lock and the processes once a second."""

    def __init__(self, jdir: Path, run: int) -> None:
        self.jdir, self.st = jdir, state.read_state(jdir)
        self.watch = backends.of(self.st).watch_run(jdir, run)
        self.looked = 0.0

    def finished(self) -> bool:
        if self.watch.final():
            return True
        if time.monotonic() - self.looked < 1.0:
            return False
        self.looked = time.monotonic()
        if current_phase(self.jdir, self.st) != Phase.LOST:
            return False
        return not any(m.alive for m in scan(target_of(self.st)).values())


class _LogReader:
    """Reads a growing log from an offset, never splitting a UTF-8 character, and across
    its rotations without a gap.

    A rotation copies the log to ``.1`` (older copies move up) and empties it in place:
    the same file, shorter. The copies are told apart by inode: a ``.1`` that is not the
    one seen at the last read means rotations happened since, and the copies before the
    one seen then (oldest first) hold what this reader has not read: the first from
    where the reader was, the others whole. They are opened at once (an open copy reads
    the same when it moves up again) and read before the log, which is then read from
    its start. Without copies (``log_keep = 0``), or a log shortened by hand, the log is
    read again from its start: what was not read is gone.
    """

    def __init__(self, path: Path, start: FollowFrom) -> None:
        self.path = path
        self.pos = start.pos
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.seen_copy = start.copy
        self.backlog: list[tuple[BinaryIO, int]] = []  # (an open copy, where to read it from)
        self.recent = b""  # the last bytes read of the log, ending at pos (none known yet)
        self.shrunk_since: float | None = None  # when the log was first seen shorter than pos
        self.gaps = 0  # rotations that removed lines before this reader read them

    def read(self, *, final: bool = False) -> str:
        self._notice_rotations()
        data = self._read_backlog()
        if not data:
            try:
                with open(self.path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < self.pos and not self._shortened():
                        return ""  # emptied by a rotation whose copy is not named yet
                    f.seek(self.pos)
                    data = f.read(CHUNK)
            except FileNotFoundError:
                data = b""
            self.pos += len(data)
            self.recent = (self.recent + data)[-RECENT:]
        return self.decoder.decode(data, final=final and not self.backlog)

    def close(self) -> None:
        """Close the copies still open to be read."""
        for f, _ in self.backlog:
            f.close()
        self.backlog.clear()

    def _shortened(self) -> bool:
        """The log is shorter than this reader's offset, and no new copy explains it: a
        rotation names its copy `.1` a moment after it empties the log, so only after
        SETTLE_S is it taken as shortened by hand (or with no copies kept) and read again
        from its start."""
        now = time.monotonic()
        self.shrunk_since = self.shrunk_since or now
        if now - self.shrunk_since < SETTLE_S:
            return False
        self.pos, self.recent, self.shrunk_since = 0, b"", None
        return True

    def _notice_rotations(self) -> None:
        now = _identity(_copy_path(self.path, 1))
        if now is None or now == self.seen_copy:
            return
        new: list[Path] = []
        for i in itertools.count(1):  # the copies made since the last read, newest first
            copy = _copy_path(self.path, i)
            ident = _identity(copy)
            older = (
                self.seen_copy is not None and ident is not None and ident[3] < self.seen_copy[3]
            )
            if ident is None or ident == self.seen_copy or older:
                break  # older: a stale copy (another log_keep), made before the one seen
            new.append(copy)
        self.shrunk_since = None
        self.seen_copy = now
        opened = []
        for copy in reversed(new):
            with contextlib.suppress(OSError):
                fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                opened.append(os.fdopen(fd, "rb"))
        for k, f in enumerate(opened):
            was_in = k == 0 and self._was_in(f)
            # the copy it was in went with the oldest: what it had not read of it is gone
            # (nothing, if it had read it all: that cannot be told once it is gone)
            self.gaps += k == 0 and not was_in
            self.backlog.append((f, self.pos if was_in else 0))
        self.pos, self.recent = 0, b""  # the log itself: from its start, once copies are read

    def _was_in(self, f: BinaryIO) -> bool:
        """Whether copy ``f`` is the log this reader was in: its bytes up to the reader's
        offset end as what the reader last read (the oldest new copy is not, when that
        one was rotated out of the kept copies too: it is then read from its start)."""
        if not self.recent:  # nothing read yet to check it by (a follow's start): its offset
            return True
        if self.pos < len(self.recent):
            return False
        f.seek(self.pos - len(self.recent))
        return f.read(len(self.recent)) == self.recent

    def _read_backlog(self) -> bytes:
        while self.backlog:
            f, at = self.backlog[0]
            f.seek(at)
            data = f.read(CHUNK)
            if data:
                self.backlog[0] = (f, at + len(data))
                return data
            f.close()
            self.backlog.pop(0)
        return b""


CHUNK = 1 << 20  # the most one read of a follow returns
RECENT = 256  # bytes a follow keeps of what it read last, to find its place in a copy
SETTLE_S = 0.5  # a log seen shorter than a follow's offset with no new copy: shortened


def _copy_path(path: Path, i: int) -> Path:
    return path.with_name(f"{path.name}.{i}")


def _identity(path: Path) -> tuple[int, ...] | None:
    """What tells one rotated copy from another: device, inode, size and mtime (a copy
    never changes once made; its inode number alone may be a removed copy's, reused).
    None when there is none (or it is not a file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None
