"""The end of a file, cheaply: the one reader behind every "last lines of the log".

Logs grow for days; none of these readers costs more than the bytes it returns (a seek to
the end, then one read, or a few blocks backwards for a number of lines). Each opens the
file without following a symlink at its last component, so a job cannot point its log
at someone else's file and have trainctl read it out.
"""

from __future__ import annotations

import os
from pathlib import Path

BLOCK = 1 << 16


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_end(path: Path, nbytes: int) -> tuple[bytes, bool]:
    """The last ``nbytes`` of ``path`` and whether the file holds more before them
    (``b""`` when it cannot be read)."""
    try:
        fd = _open(path)
    except OSError:
        return b"", False
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - nbytes))
        return f.read(), size > nbytes


def read_span(path: Path, offset: int | None, nbytes: int) -> tuple[int, bytes, int]:
    """(where the data begins, the data, the file's size): up to ``nbytes`` from
    ``offset``, or for None the last ``nbytes``; never past the size it saw, so a reader
    that goes on from ``start + len(data)`` misses and repeats nothing. An offset past
    the end reads from 0 (the file was rotated). (0, b"", 0) when it cannot be read."""
    try:
        fd = _open(path)
    except OSError:
        return 0, b"", 0
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - nbytes) if offset is None else offset if offset <= size else 0
        f.seek(start)
        return start, f.read(min(nbytes, size - start)), size


def tail_text(path: Path, nbytes: int) -> str:
    """The last ``nbytes`` of a file as text ('' if it is gone)."""
    return read_end(path, nbytes)[0].decode(errors="replace")


def tail_lines(path: Path, nbytes: int) -> list[str]:
    """The whole lines within the last ``nbytes`` of ``path`` ([] when it cannot be read)."""
    data, cut = read_end(path, nbytes)
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if cut else lines  # the first one may be cut


def latest_frame(line: str) -> str:
    """A line redrawn with carriage returns (a progress bar): its latest non-empty frame
    (so ``abc\r``, a CRLF line, is ``abc``)."""
    if "\r" not in line:
        return line
    frames = [f for f in line.split("\r") if f.strip()]
    return frames[-1] if frames else ""


def shown_lines(text: str) -> list[str]:
    """``text``'s lines as a terminal leaves them: split at newlines only (a carriage
    return redraws its line, it does not start one), each as its latest frame."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # after a final newline
    return [latest_frame(x) for x in lines]


def last_line(path: Path, nbytes: int = 8192, width: int = 200) -> str:
    """The last non-empty line of a file (its latest frame), cut to ``width``.

    The first line read is kept even when cut: a progress bar that never prints a
    newline makes the whole log one line, and its latest frame is what there is to show.
    """
    for raw in reversed(shown_lines(tail_text(path, nbytes))):
        text = raw.strip()
        if text:
            return text[:width]
    return ""


def last_lines_bytes(path: Path, lines: int, block: int = BLOCK) -> bytes:
    """The end of ``path`` holding its last ``lines`` lines, read backwards block by block.

    `logs -n 5` on a 500 MiB log reads a few KiB, not the file: its cost does not grow
    with the log. FileNotFoundError (and other OSErrors) reach the caller.
    """
    return last_lines_at(path, lines, block)[1]


def read_from(path: Path, offset: int) -> bytes:
    """``path`` from byte ``offset`` on (OSErrors reach the caller)."""
    with os.fdopen(_open(path), "rb") as f:
        f.seek(offset)
        return f.read()


def last_lines_at(path: Path, lines: int, block: int = BLOCK) -> tuple[int, bytes]:
    """(offset, data): :func:`last_lines_bytes` and where in the file its data begins."""
    with os.fdopen(_open(path), "rb") as f:
        end = f.seek(0, os.SEEK_END)
        pos, chunks, newlines = end, [], 0
        while pos > 0 and newlines <= lines:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            chunks.append(chunk)
            # a final line without its newline still counts as a line
            newlines += chunk.count(b"\n")
        return pos, b"".join(reversed(chunks))


# Where a reader that lives stopped in a file: (device, inode, offset at a line's end)
Mark = tuple[int, int, int]


def read_appended(
    path: Path, mark: Mark | None, window: int | None = None
) -> tuple[Mark, int, bytes, bool, int]:
    """The whole lines of ``path`` written since ``mark``, for a reader that keeps what
    it parsed (`trainctl web`'s caches): (the new mark, the offset the lines start at,
    the lines, whether they were read afresh, the file's size). Afresh when there is no
    mark or the file is another (its inode) or shorter than the mark: from its start, or
    within its last ``window`` bytes from the first whole line. A line not ended yet is
    left for the next read. OSErrors reach the caller."""
    with os.fdopen(_open(path), "rb") as f:
        st = os.fstat(f.fileno())
        fresh = mark is None or mark[:2] != (st.st_dev, st.st_ino) or st.st_size < mark[2]
        if not fresh and mark is not None:
            start = mark[2]
        else:
            start = 0 if window is None else max(0, st.st_size - window)
        f.seek(start)
        data = f.read()
    if fresh and start:  # the first line may be cut: from the next one on
        skip = data.find(b"\n") + 1
        data, start = data[skip:], start + skip
    end = data.rfind(b"\n") + 1
    return (st.st_dev, st.st_ino, start + end), start, data[:end], fresh, st.st_size
