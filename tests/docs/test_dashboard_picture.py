"""docs/quickstart.md section 12's picture of the dashboard: docs/images/monitoring-dashboard.png is
drawn by dsv4kit.monitor.render from the series committed beside it
(docs/images/monitoring-dashboard.json), which the quickstart journey fetched from the simulated
box's real Prometheus (DSV4KIT_DASHBOARD_PICTURE=docs/images/monitoring-dashboard.png when running
tests/journey/test_quickstart_journey.py writes both; the journey checks on every run that its own
series still have the committed ones' shape). Here: those series cover every panel of the
generated dashboard with data, and the generator draws them (into a scratch folder)."""

from __future__ import annotations

import json

import pytest

from tests.journey.quickstart_monitoring import NO_FINITE, PICTURE_NOTE, PICTURE_SERIES, series_shape

pytest.importorskip("matplotlib")


def test_the_committed_picture_is_drawn_from_the_journeys_series_of_every_panel(tmp_path):
    from dsv4kit.monitor import render
    from dsv4kit.monitor.panels import all_panels

    committed = json.loads(PICTURE_SERIES.read_text())
    assert committed["note"] == PICTURE_NOTE  # from the quickstart journey
    shape = series_shape(committed["series"])
    assert list(shape) == [panel.title for panel in all_panels()]
    assert all(shape.values()), [title for title, kinds in shape.items() if not kinds]
    assert not [title for title, kinds in shape.items() if NO_FINITE in kinds]  # no panel drawn empty
    tables = {panel.title for panel in all_panels() if panel.kind == "table"}
    assert {title for title, kinds in shape.items() if kinds == ["table"]} == tables
    out = render.render(committed["series"], tmp_path / "dashboard.png", committed["note"], committed["start"],
                        committed["span"])
    assert out.stat().st_size > 20_000
    picture = PICTURE_SERIES.with_suffix(".png")
    assert picture.exists() and f"images/{picture.name}" in (PICTURE_SERIES.parents[1] / "quickstart.md").read_text()
