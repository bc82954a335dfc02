"""A local run followed by its supervisor's events: `wait`, `logs -f`, a restart's end."""

from __future__ import annotations

from pathlib import Path

from trainctl.supervisor.model import events, state


class EventWatch:
    """A local run followed by its supervisor's events (``events.Follow``): over at its
    ``ended`` or ``restart_scheduled`` event, or a later run's ``started``. state.json is
    read once, after the follow began, for a run that ended before it. A supervisor that
    dies writes nothing more: its run is lost, not over (as `status` says), and the
    watch's caller waits out its time."""

    def __init__(self, jdir: Path, run: int) -> None:
        self.run = run
        self.follow = events.Follow(jdir)  # first: nothing after this look is missed
        st = state.read_state(jdir)
        relaunch = st.run != run or st.restart_at is not None
        self.done = relaunch or st.phase.ended
        self.ended = st.run == run and st.phase.ended and st.restart_at is None

    def over(self) -> bool:
        if self.done:
            return True
        for ev in self.follow.new():
            ended = isinstance(ev, events.Ended) and ev.run == self.run
            relaunch = isinstance(ev, events.RestartScheduled) and ev.run == self.run
            later = isinstance(ev, events.Started) and ev.run > self.run
            self.ended = self.ended or ended
            self.done = self.done or ended or relaunch or later
        return self.done

    def final(self) -> bool:
        return self.over() and self.ended
