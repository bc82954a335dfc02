"""The stall watchdog's deadline, learned from the run (``stall_timeout = "auto"``).

A fixed stall timeout must be longer than the longest save, so a hung collective is
noticed after minutes (20 by custom). Learned instead: the supervisor looks at the run's
activity (the newest write to its log or $TRAINCTL_PROGRESS) every 0.5 s, and at its
newest checkpoint. A gap between two writes during which a checkpoint was written is a
save (its length is learned too); any other gap is a step. The deadline is
:data:`FACTOR` times the longest step gap seen, at least :data:`FLOOR_S`; no stall is
called while a save is under way (a checkpoint written within :data:`SAVING_S`), nor
before :data:`LEARN_GAPS` step gaps were seen.
"""

from __future__ import annotations

from dataclasses import dataclass

FACTOR = 4.0  # a small multiple of the longest normal gap between steps
FLOOR_S = 2.0  # never a deadline under this (the look itself is every 0.5 s)
LEARN_GAPS = 5  # step gaps seen before a deadline is called
SAVING_S = 2.0  # a checkpoint written this recently: a save is under way


@dataclass
class StallLearner:
    """What the run's activity taught: its longest step gap and its longest save."""

    last_activity: float | None = None
    longest_step_s: float = 0.0
    longest_save_s: float = 0.0
    step_gaps: int = 0

    def observe(self, activity: float, newest_ckpt: float) -> None:
        """Feed the newest write time of the run's log/progress and of its checkpoints."""
        last, self.last_activity = self.last_activity, activity
        if last is None or activity <= last:
            return
        gap = activity - last
        if last < newest_ckpt <= activity + SAVING_S:
            self.longest_save_s = max(self.longest_save_s, gap)
        else:
            self.longest_step_s = max(self.longest_step_s, gap)
            self.step_gaps += 1

    @property
    def deadline_s(self) -> float | None:
        """The learned stall deadline (None: still learning)."""
        if self.step_gaps < LEARN_GAPS:
            return None
        return max(FLOOR_S, FACTOR * self.longest_step_s)

    def stalled_for(self, now: float, newest_ckpt: float) -> float | None:
        """Seconds past the deadline the run has been quiet (None: not stalled)."""
        deadline = self.deadline_s
        if deadline is None or self.last_activity is None:
            return None
        if now - newest_ckpt < SAVING_S:
            return None  # a save is under way: its folder is being written
        idle = now - self.last_activity
        return idle if idle >= deadline else None
