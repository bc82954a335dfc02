"""supervisor/model/tail.py: the one reader of a file's end (logs, events, progress files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainctl.supervisor.model import tail


def test_tail_lines_drops_the_line_the_cut_went_through(tmp_path: Path) -> None:
    log = tmp_path / "run-1.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    got = tail.tail_lines(log, 64)
    assert got[-1] == "line 999"
    assert all(x.startswith("line ") and len(x) >= 6 for x in got)
    assert len("".join(f"{x}\n" for x in got)) <= 64
    assert tail.tail_lines(log, 1 << 20)[0] == "line 0"  # nothing cut: the first line stays


def test_last_line_shows_a_progress_bars_latest_frame_even_in_one_long_line(
    tmp_path: Path,
) -> None:
    """tqdm without a newline: the whole log is one line, longer than what is read."""
    log = tmp_path / "run-1.log"
    log.write_text("".join(f"\r{i}/100000 it" for i in range(100000)))
    assert tail.last_line(log) == "99999/100000 it"
    log.write_text("loss 1.0\n\n   \n")
    assert tail.last_line(log) == "loss 1.0"
    assert tail.last_line(tmp_path / "gone.log") == ""


def test_last_lines_bytes_reads_back_only_what_it_needs(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with open(log, "wb") as f:
        f.write(b"x" * (4 << 20) + b"\n")
        f.write(b"".join(b"tail %d\n" % i for i in range(5)))
    got = tail.last_lines_bytes(log, 3, block=4096)
    assert got.endswith(b"tail 2\ntail 3\ntail 4\n")
    assert len(got) <= 2 * 4096  # a block or two, not the 4 MiB before them


def test_a_symlinked_file_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not yours\n")
    link = tmp_path / "run-1.log"
    os.symlink(secret, link)
    assert tail.tail_text(link, 100) == ""
    assert tail.tail_lines(link, 100) == []
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        tail.last_lines_bytes(link, 5)


def test_read_span_reads_from_an_offset_or_the_end_and_restarts_past_the_end(
    tmp_path: Path,
) -> None:
    p = tmp_path / "log"
    p.write_bytes(b"0123456789")
    assert tail.read_span(p, None, 4) == (6, b"6789", 10)
    assert tail.read_span(p, None, 40) == (0, b"0123456789", 10)
    assert tail.read_span(p, 3, 4) == (3, b"3456", 10)
    assert tail.read_span(p, 10, 4) == (10, b"", 10)
    assert tail.read_span(p, 11, 4) == (0, b"0123", 10)  # rotated: from its start
    assert tail.read_span(tmp_path / "none", 0, 4) == (0, b"", 0)
    (tmp_path / "link").symlink_to(p)
    assert tail.read_span(tmp_path / "link", None, 4) == (0, b"", 0)  # not followed


def test_shown_lines_split_at_newlines_only_each_its_latest_frame() -> None:
    """A carriage return redraws its line (tqdm): the web tail, a hook's last lines and
    `status`'s last line showed each frame as a line of its own (str.splitlines)."""
    bar = "\r 10%|#   |\r 50%|##  |\r100%|####|"
    assert tail.shown_lines(f"start\n{bar}\ndone\n") == ["start", "100%|####|", "done"]
    assert tail.shown_lines("crlf\r\nline two\r\n") == ["crlf", "line two"]
    assert tail.shown_lines("a\n\nb") == ["a", "", "b"]  # an empty line stays; no final piece
    assert tail.latest_frame("kept\r   \r") == "kept"  # a frame of blanks clears nothing shown
    assert tail.latest_frame("\r") == ""
