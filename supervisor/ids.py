"""Random names: a run's marker, a waiter's token, a probe's suffix (one helper, no uuid).

``uuid`` imports ``platform`` (~1.5 ms) and its hex is all trainctl ever used of it; the
status path must not load either. 128 random bits from the kernel, as 32 hex digits,
are what ``uuid.uuid4().hex`` gave (less its 6 fixed version bits).
"""

from __future__ import annotations

import os


def new_marker() -> str:
    """A fresh run marker or token: 32 hex digits, 128 random bits."""
    return os.urandom(16).hex()


def short_id() -> str:
    """8 hex digits: a temporary name's suffix (a probe cgroup), not an identity."""
    return os.urandom(4).hex()


def temp_name(name: str) -> str:
    """The hidden, unpredictable name a file is written under before its rename."""
    return f".{name}.{os.getpid()}.{short_id()}.tmp"
