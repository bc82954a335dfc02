"""ops/goodput.PointsCache (issue 56 §5): the web page's goodput reads each progress file
once, then only what was appended; its points are always those a whole read gives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainctl.launcher.ops import goodput
from trainctl.supervisor.model.steps import timed_steps


def whole(path: Path) -> list[tuple[float, float]]:
    """What `trainctl report` reads: the file, whole."""
    with open(path, "rb") as f:
        return timed_steps(f)


def line(step: int, t: float | None = None) -> bytes:
    doc = {"step": step, "loss": 1.0 / step} | ({} if t is None else {"t": t})
    return json.dumps(doc).encode() + b"\n"


def test_appends_are_read_from_where_the_last_read_stopped(tmp_path: Path) -> None:
    p = tmp_path / "run-1.progress.jsonl"
    p.write_bytes(b"".join(line(i, 100.0 + i) for i in range(1, 6)))
    cache = goodput.PointsCache()
    assert cache.read(p) == whole(p) == [(100.0 + i, float(i)) for i in range(1, 6)]
    # a line still being written is left for the next read, then read whole
    half = line(6, 106.0)
    with open(p, "ab") as f:
        f.write(half[:9])
    assert cache.read(p) == whole(p)[:5]
    with open(p, "ab") as f:
        f.write(half[9:] + b"not json\n" + line(7) + line(8, 108.0))  # junk, no t: skipped
    assert cache.read(p) == whole(p) == [(100.0 + i, float(i)) for i in (1, 2, 3, 4, 5, 6, 8)]


def test_only_the_appended_bytes_are_parsed(tmp_path: Path) -> None:
    """What was read is not read again: bytes before the offset that change afterwards
    (which a trainer never does) do not show, as the cache reads from where it stopped."""
    p = tmp_path / "p.jsonl"
    p.write_bytes(line(1, 1.0) + line(2, 2.0))
    cache = goodput.PointsCache()
    assert cache.read(p) == [(1.0, 1.0), (2.0, 2.0)]
    with open(p, "r+b") as f:  # same size, same inode: rewritten in place
        f.write(line(9, 9.0))
    assert cache.read(p) == [(1.0, 1.0), (2.0, 2.0)]


def test_a_replaced_or_shortened_file_is_read_again(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_bytes(line(1, 1.0) + line(2, 2.0) + line(3, 3.0))
    cache = goodput.PointsCache()
    assert len(cache.read(p)) == 3
    p.write_bytes(line(5, 5.0))  # truncated, then written: shorter than what was read
    assert cache.read(p) == whole(p) == [(5.0, 5.0)]
    new = tmp_path / "new.jsonl"
    new.write_bytes(b"".join(line(i, float(i)) for i in range(10, 20)))
    os.replace(new, p)  # another inode, longer: not appended to what was read
    assert cache.read(p) == whole(p)
    p.unlink()
    with pytest.raises(FileNotFoundError):  # as for a whole read: the next file is tried
        cache.read(p)
    assert not cache._files  # and forgotten: a web server outlives removed jobs
