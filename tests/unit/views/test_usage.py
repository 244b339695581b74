"""Usage report folding (pure) and its CSV shape."""

from __future__ import annotations

import csv
import io

import pytest

from broker.store.reports import HoursRow
from broker.views.usage import CSV_FIELDS, to_csv, usage_report

ROWS = [
    HoursRow("vision", "usage", 10.0, 20.0, 0.0),
    HoursRow("vision", "waste:preparing", 1.0, 2.0, 0.0),
    HoursRow("vision", "waste:cancelled", 2.0, 4.0, 0.0),
    HoursRow("language", "usage", 5.0, 0.0, 5.0),  # booked before costs were numeric
    HoursRow("language", "waste", 1.5, 0.0, 1.5),
    HoursRow("language", "waste:failed", 0.5, 0.5, 0.0),
]


def test_lines_per_group_and_a_total_that_adds_up() -> None:
    r = usage_report(ROWS, "team", None, None)
    lines = {line.key: line for line in r.lines}
    assert [line.key for line in r.lines] == ["language", "vision"]
    v = lines["vision"]
    assert (v.gpu_hours, v.cost, v.wasted_gpu_hours, v.wasted_cost) == (10.0, 20.0, 3.0, 6.0)
    assert (v.waste_preparing, v.waste_cancelled, v.waste_failed) == (1.0, 2.0, 0.0)
    lang = lines["language"]
    assert (lang.unpriced_gpu_hours, lang.waste_unsplit, lang.waste_failed) == (5.0, 1.5, 0.5)
    t = r.total
    assert t.gpu_hours == v.gpu_hours + lang.gpu_hours
    assert t.wasted_gpu_hours == pytest.approx(5.0)
    assert t.cost == 20.0


def test_csv_has_a_header_a_line_per_group_and_the_total() -> None:
    text = to_csv(usage_report([*ROWS, HoursRow("=cmd()", "usage", 1.0, 1.0, 0.0)], "user",
                               None, None))
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["user", *CSV_FIELDS[1:]]
    assert [r[0] for r in rows[1:]] == ["'=cmd()", "language", "vision", "total"]
    assert all(len(r) == len(CSV_FIELDS) for r in rows)
    assert float(rows[-1][CSV_FIELDS.index("gpu_hours")]) == pytest.approx(16.0)
