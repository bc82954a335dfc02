"""The server-drawn charts (launcher/charts.py): thinning keeps every peak, the SVG has
the points, and every label is escaped."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from trainctl.launcher import charts, render
from trainctl.launcher.ops.runview import _verdict, stored_stacks
from trainctl.supervisor.model.reports import GpuRelease, StopReport


def test_thinning_keeps_each_columns_extremes_in_time_order() -> None:
    pts = [(float(t), math.sin(t / 50.0)) for t in range(100_000)]
    pts[77_777] = (77_777.0, 50.0)  # one spike, one sample wide
    thin = charts.thin(pts, 0.0, 99_999.0, 600)
    assert len(thin) <= 1200
    assert (77_777.0, 50.0) in thin
    assert [p[0] for p in thin] == sorted(p[0] for p in thin)
    assert min(v for _, v in thin) == min(v for _, v in pts)
    few = [(0.0, 1.0), (1.0, 2.0)]
    assert charts.thin(few, 0.0, 1.0, 600) == few  # nothing to thin


def test_svg_has_its_points_markers_cap_and_escaped_labels() -> None:
    chart = charts.Chart(
        "<loss>",
        [charts.Series("a&b", [(0.0, 1.0), (10.0, 3.0), (20.0, 2.0)])],
        markers=[charts.Marker(10.0, "ckpt <x>", "checkpoint")],
        y_max=4.0,
    )
    svg = charts.render(chart)
    assert svg.startswith('<svg class="chart"')
    assert 'data-points="3"' in svg
    pts = re.search(r' points="([^"]+)"', svg)
    assert pts is not None
    assert len(pts.group(1).split()) == 3
    assert "&lt;loss&gt;" in svg
    assert "a&amp;b" in svg
    assert "ckpt &lt;x&gt;" in svg
    assert 'class="cap"' in svg
    assert "<loss>" not in svg
    empty = charts.render(charts.Chart("gpu", [charts.Series("gpu 0", [])]))
    assert "no samples yet" in empty


def test_a_loss_on_a_log_scale_against_the_step() -> None:
    """issue 56 §5: a loss falling by decades gets a log axis (its middle tick is the
    geometric mean), and a chart against the step says steps, not times."""
    loss = [(float(s), 10.0 / (1 + s)) for s in range(0, 1000)]  # 10 down to 0.01
    svg = charts.render(charts.Chart("loss by step", [charts.Series("loss", loss)],
                                     from_zero=False, x="step", log_y=True))  # fmt: skip
    ticks = re.findall(r'class="tick"[^>]*>([^<]+)<', svg)
    assert ticks[:3] == ["0.01", "0.3162", "10"], ticks  # sqrt(0.01 * 10)
    assert "step 0" in ticks
    assert "step 999" in ticks
    assert "log scale" in ticks
    hovers = re.findall(r'<circle class="hover"[^>]*><title>([^<]+)</title>', svg)
    assert hovers[0] == "loss step 0: 10", hovers[0]
    # decades get equal heights: at step 20 (loss 0.48, 5% of the top value) the line is
    # still above the middle, where a linear axis would have it near the bottom
    drawn = re.search(r' points="([^"]+)"', svg)
    assert drawn is not None
    ys = [float(p.split(",")[1]) for p in drawn.group(1).split()]
    assert ys[20] < (ys[0] + ys[-1]) / 2
    # a value at or below zero: a log axis cannot show it, the chart stays linear
    flat = charts.Chart("x", [charts.Series("x", [(0.0, 0.0), (1.0, 2.0)])], log_y=True)
    assert not flat.logged()
    assert "log scale" not in charts.render(flat)


def test_the_timelines_verdict_is_the_stops_own() -> None:
    """The page says what `stop` says: held or unverified GPUs and unproven stops too."""
    held = StopReport(ok=True, total_s=1.5, gpus=[GpuRelease(index=3, ok=False)])
    assert _verdict(held) == "nothing of the job is alive, but GPU(s) 3 NOT released (1.50 s)"
    unproven = StopReport(ok=True, total_s=0.2, unproven="signals mode, no supervisor")
    assert "NOT PROVEN" in _verdict(unproven)
    clean = StopReport(ok=True, total_s=0.01, gpus=[GpuRelease(index=0, ok=True)])
    assert _verdict(clean) == "nothing of the job is alive, GPUs released (0.01 s)"


def test_axes_and_hovers_say_plain_rounded_numbers() -> None:
    """issue 44 §12: no scientific notation on an axis; every point says its value on
    hover (an SVG <title> on an invisible point)."""
    steps = [(float(t), 12_000.0 + 900.0 * t) for t in range(300)]
    svg = charts.render(charts.Chart("step", [charts.Series("s<1>", steps)]))
    ticks = re.findall(r'class="tick"[^>]*>([^<]+)<', svg)
    assert "281,100" in ticks, ticks  # the top of the axis: 1.2e+04 before
    assert not any("e+" in t or "e-" in t for t in ticks), ticks
    hovers = re.findall(r'<circle class="hover"[^>]*><title>([^<]+)</title>', svg)
    assert 50 <= len(hovers) <= charts.HOVER_POINTS + 1
    assert hovers[0].startswith("s&lt;1&gt; "), hovers[0]
    assert hovers[0].endswith(": 12,000"), hovers[0]
    assert [charts.plain(v) for v in (0.031, 1.25e6, 250.4, 3.14159)] == [
        "0.031", "1.25M", "250", "3.14"
    ]  # fmt: skip


def test_stored_stacks_are_shown_as_stacks(tmp_path: Path) -> None:
    """A stacks file the supervisor wrote (py-spy's JSON per process) is grouped and
    rendered as `trainctl stack` shows it, never as raw JSON."""
    frames = [{"name": "wait", "short_filename": "dist.py", "line": 7},
              {"name": "train", "short_filename": "train.py", "line": 42}]  # fmt: skip
    doc = {
        "at": 1.0,
        "run": 3,
        "processes": [
            {"pid": 4194001, "cmd": "python train.py", "threads": [
                {"thread_name": "MainThread", "frames": frames}], "error": None},
            {"pid": 4194002, "cmd": "python train.py", "threads": [
                {"thread_name": "MainThread", "frames": frames}], "error": None},
            {"pid": 4194003, "cmd": "loader", "threads": [], "error": "ptrace refused"},
        ],
    }  # fmt: skip
    path = tmp_path / "run-3.stall.json"
    path.write_text(json.dumps(doc))
    report = stored_stacks(str(path), "j", 1)
    assert report is not None
    assert report.run == 3
    [group] = report.groups
    assert sorted(t.pid for t in group.threads) == [4194001, 4194002]
    text = render.stacks(report)
    assert "2 thread(s): pid 4194001" in text
    assert "    train (train.py:42)" in text
    assert "skipped pid 4194003 loader: ptrace refused" in text
    assert "{" not in text
    assert stored_stacks(str(tmp_path / "missing.json"), "j", 1) is None
    (tmp_path / "bad.json").write_text("{not json")
    assert stored_stacks(str(tmp_path / "bad.json"), "j", 1) is None
