"""A cost report as CSV, for a spreadsheet: a header row, then one row per
group (or one `total` row when ungrouped), RFC 4180 (CRLF line ends, fields
quoted where they hold a comma, a quote or a line end).

The text cells are a team's own words (job names, label values), and a
spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` as a formula
(OWASP's CSV injection): such a cell is written with a leading `'`, which
spreadsheets show as text. The numbers are the broker's and stay numbers.
"""
from __future__ import annotations

import csv
import io
from datetime import datetime

from spotbroker.broker.money.views import Report

HEADER = ("team", "since", "until", "group_by", "key", "name", "cost", "on_demand_cost", "savings", "wasted",
          "node_hours", "currency", "kwh", "co2e_kg")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def inert(text: str) -> str:
    """A text cell a spreadsheet shows as the text it is."""
    return "'" + text if text.startswith(_FORMULA) else text


def _figures(*values: float) -> list[str]:
    return [f"{round(v, 6):.6f}" for v in values]


def report_csv(team: str, since: datetime, until: datetime, group_by: str | None, report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")   # minimal quoting: RFC 4180's
    writer.writerow(HEADER)
    head = [team, since.isoformat(), until.isoformat(), group_by or ""]
    rows = report.groups.items() if group_by else [("total", report.total)]
    for key, money in rows:
        writer.writerow([*map(inert, head), inert(key), inert(report.names.get(key, "")),
                         *_figures(money.cost, money.on_demand_cost, money.savings, money.wasted, money.node_hours),
                         "USD", *_figures(money.kwh, money.co2e_kg)])
    return out.getvalue()
