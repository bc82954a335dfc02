"""Training progress for `status`: latest metrics, step rate, ETA and a sparkline.

Sources: the JSON lines a job appends to $TRAINCTL_PROGRESS, and/or ``progress_regex``
(named groups) applied to log lines. Only the tail of each file is read, so a days-long
log costs no more than a fresh one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainctl.launcher.results import Progress
from trainctl.supervisor.model.spec import Spec
from trainctl.supervisor.model.state import JobState, log_path, progress_path
from trainctl.supervisor.model.steps import number, numbers, progress_of, steps_path
from trainctl.supervisor.model.tail import tail_lines

TAIL_BYTES = 256 * 1024
RATE_WINDOW = 20  # supervisor samples (about 15 s apart) in the ETA's window: ~5 min
SPARK = "▁▂▃▄▅▆▇█"


def _points(jdir: Path, st: JobState, spec: Spec) -> list[dict[str, float]]:
    points: list[dict[str, float]] = []
    for line in tail_lines(progress_path(jdir, st.run), TAIL_BYTES):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and (nums := numbers(doc)) is not None:
            points.append(nums)
    if spec.watch.progress_regex:
        rx = re.compile(spec.watch.progress_regex)
        for line in tail_lines(log_path(jdir, st.run), TAIL_BYTES):
            if (nums := progress_of(line, rx)) is not None:
                points.append(nums)
    return points


def read_progress(jdir: Path, st: JobState, spec: Spec) -> Progress | None:
    """Return the run's progress, or None when it reports none."""
    points = _points(jdir, st, spec)
    if not points:
        return None
    last = points[-1]
    prog = Progress(
        step=last["step"],
        total_steps=spec.watch.total_steps,
        metrics={k: v for k, v in last.items() if k not in ("step", "t")},
    )
    prog.main_metric = "loss" if "loss" in prog.metrics else next(iter(prog.metrics), None)
    if prog.main_metric:
        prog.history = [p[prog.main_metric] for p in points if prog.main_metric in p][-24:]
    prog.steps_per_s = _rate(points, st, jdir, spec)
    if prog.total_steps and prog.steps_per_s and prog.step is not None:
        prog.eta_s = max(0.0, (prog.total_steps - prog.step) / prog.steps_per_s)
    return prog


def _rate(points: list[dict[str, float]], st: JobState, jdir: Path, spec: Spec) -> float | None:
    """Steps per second over a recent window: steps and times of the same points."""
    timed = [p for p in points if "t" in p][-50:]
    if len(timed) < 2:
        # log-reported progress has no times: the supervisor's timed samples of it
        timed = _samples(log_path(jdir, st.run))[-RATE_WINDOW:]
    if len(timed) >= 2 and timed[-1]["t"] > timed[0]["t"]:
        steps = timed[-1]["step"] - timed[0]["step"]
        return steps / (timed[-1]["t"] - timed[0]["t"]) if steps > 0 else None
    # Too early for two samples. Only when the log's tail is the whole log is its first
    # step the run's first, so that steps since start over time since start is a rate.
    log = log_path(jdir, st.run)
    try:
        s = log.stat()
    except OSError:
        return None
    if s.st_size > TAIL_BYTES:
        return None  # no ETA rather than a wrong one
    elapsed = s.st_mtime - st.started_at
    steps = points[-1]["step"] - min(p["step"] for p in points)
    return steps / elapsed if elapsed > 0 and steps > 0 else None


def _samples(log: Path) -> list[dict[str, float]]:
    out = []
    for line in tail_lines(steps_path(log), TAIL_BYTES):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(doc, dict)
            and (t := number(doc.get("t")))
            and (s := number(doc.get("step"))) is not None
        ):
            out.append({"t": t, "step": s})
    return out


def sparkline(values: list[float]) -> str:
    """Render values as ▁▂▃▄▅▆▇█."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))] for v in values)
