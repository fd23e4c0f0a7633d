"""The DeepSeek-V4 PD dashboard as Grafana JSON, built with Grafana's foundation SDK from
:mod:`dsv4kit.monitor.panels`. ``python -m dsv4kit.monitor.dashboard PATH`` writes it; the
monitoring role ships the result (playbooks/roles/monitoring/files/dsv4-pd-dashboard.json) and a
test checks that file is this output."""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import table as gtable
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from dsv4kit.monitor.panels import ROWS, Panel

UID = "dsv4-pd"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="dsv4-prometheus")  # the role's provisioned one


def _panel(panel: Panel):
    builder = (gtable.Panel() if panel.kind == "table" else gts.Panel()).title(panel.title).datasource(DATASOURCE)
    builder = builder.unit(panel.unit).height(8).span(12 if panel.kind == "table" else 8)
    for index, (expr, legend) in enumerate(panel.queries):
        query = gprom.Dataquery().expr(expr).ref_id(chr(ord("A") + index))
        query = query.instant() if panel.kind == "table" else query.range().legend_format(legend)
        builder = builder.with_target(query)
    return builder


def build() -> dict:
    """The dashboard as the JSON object Grafana's file provisioning reads."""
    board = (gdash.Dashboard("DeepSeek-V4 PD box").uid(UID).tags(["dsv4kit", "sglang", "dcgm"])
             .refresh("30s").time("now-3h", "now").timezone("browser"))
    for title, panels in ROWS:
        board = board.with_row(gdash.Row(title))
        for panel in panels:
            board = board.with_panel(_panel(panel))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args:
        with open(args[0], "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
