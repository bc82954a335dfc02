"""The queue of a home, in three parts: its entries (entries.py: the files, their locks,
the cached view of the home), what each waits for (policy.py: pure decisions on that
view) and the start or dispatch of them (dispatch.py: the only part that starts jobs and
waiter processes, so `status` never loads it).

The package exports the entries and the policy; ``queue.dispatch`` is imported by name.
"""

from __future__ import annotations

from .entries import (
    GPU_POLL_S,
    NO_WAITER_S,
    TICK_S,
    WHEN,
    After,
    Entry,
    HomeView,
    dequeue,
    entries,
    entry_path,
    has_live_run,
    known,
    next_run,
    parse_after,
    queue_dir,
    queue_lock,
    queued_names,
    ran_since_queued,
    read_entry,
    record_never_ran,
    run_is_live,
    singleton_key,
    wait_dispatched,
    waiter_alive,
)
from .policy import (
    Blocked,
    QueueAsk,
    Queued,
    blockers,
    check_ask,
    doomed_by_stop,
    queue_view,
    queued_of,
)

__all__ = [
    "GPU_POLL_S",
    "NO_WAITER_S",
    "TICK_S",
    "WHEN",
    "After",
    "Blocked",
    "Entry",
    "HomeView",
    "QueueAsk",
    "Queued",
    "blockers",
    "check_ask",
    "dequeue",
    "doomed_by_stop",
    "entries",
    "entry_path",
    "has_live_run",
    "known",
    "next_run",
    "parse_after",
    "queue_dir",
    "queue_lock",
    "queue_view",
    "queued_names",
    "queued_of",
    "ran_since_queued",
    "read_entry",
    "record_never_ran",
    "run_is_live",
    "singleton_key",
    "wait_dispatched",
    "waiter_alive",
]
