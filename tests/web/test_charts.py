"""The server-drawn charts (launcher/charts.py): thinning keeps every peak, the SVG has
the points, and every label is escaped."""

from __future__ import annotations

import math
import re

from trainctl.launcher import charts
from trainctl.launcher.ops.runview import _verdict
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


def test_the_timelines_verdict_is_the_stops_own() -> None:
    """The page says what `stop` says: held or unverified GPUs and unproven stops too."""
    held = StopReport(ok=True, total_s=1.5, gpus=[GpuRelease(index=3, ok=False)])
    assert _verdict(held) == "nothing of the job is alive, but GPU(s) 3 NOT released (1.50 s)"
    unproven = StopReport(ok=True, total_s=0.2, unproven="signals mode, no supervisor")
    assert "NOT PROVEN" in _verdict(unproven)
    clean = StopReport(ok=True, total_s=0.01, gpus=[GpuRelease(index=0, ok=True)])
    assert _verdict(clean) == "nothing of the job is alive, GPUs released (0.01 s)"
