"""Opening a job's files without ever following a symlink: each is opened relative to a
descriptor of its directory (``dir_fd=``), so a directory swapped for a symlink after a
check is never written through (the check and the use are the same ``open``). Low in
the layers: the terminal and the state file both open through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from trainctl.supervisor.errors import StateError


@contextlib.contextmanager
def dir_fd(path: Path) -> Iterator[int]:
    """Hold a descriptor of directory ``path``, refusing it if it is a symlink.

    Every file of a job is opened relative to this descriptor (``dir_fd=``), so a job
    directory swapped for a symlink after a check is never written through: the check and
    the use are the same ``open``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and path.is_symlink():
            raise StateError(f"{path} is a symlink; refusing to follow it") from None
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def open_in(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open ``path`` relative to its directory's descriptor; neither may be a symlink."""
    with dir_fd(path.parent) as dfd:
        try:
            return os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StateError(f"{path} is a symlink; refusing to follow it") from None
            raise
