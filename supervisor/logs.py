"""Bounded job logs: copytruncate-style rotation of ``logs/run-N.log``.

The job writes its log itself, with O_APPEND (the supervisor is never in the data path),
so the file cannot be renamed away under it: its descriptor would keep writing to the
renamed file. Instead the supervisor copies the log to ``run-N.log.1`` (older copies
shift to ``.2`` ... ``.KEEP``) and truncates it to zero; the job's next write lands at the
new end, offset 0. What the job writes between the copy and the truncation, a few
microseconds, is the only loss, the known price of copytruncate.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def rotate_if_big(path: Path, max_bytes: int, keep: int) -> int:
    """Rotate ``path`` once it is bigger than ``max_bytes`` (0: never); return its old size."""
    try:
        size = os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0
    if not max_bytes or size <= max_bytes:
        return 0
    try:
        for i in range(keep - 1, 0, -1):
            older = path.with_name(f"{path.name}.{i}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
        if keep > 0:
            shutil.copyfile(path, path.with_name(f"{path.name}.1"), follow_symlinks=False)
    except OSError:
        pass  # a full disk (often this very log's doing): the cap matters more than the copy
    os.truncate(path, 0)
    return size
