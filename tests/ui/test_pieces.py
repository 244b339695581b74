"""Small parts of the dashboard without a browser: escaping in charts, where sign-in may send
the browser, the queue page's admission order, the pages' Server-Timing."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from broker.config import load_config
from broker.store import open_database
from broker.ui import svg
from broker.ui.pages_fleet import heat
from broker.ui.session import safe_next
from broker.web import build_app
from tests.harness.ui import TOKENS, ui_config


def test_chart_labels_are_escaped() -> None:
    out = str(svg.stacked_bars(["<b>"], {"<script>x</script>": [1.0]}))
    assert "<script>" not in out and "&lt;script&gt;" in out and "&lt;b&gt;" in out
    line = {"number": 1, "phases": [{"name": "<i>", "start": "2026-01-01T00:00:00+00:00",
                                     "end": None, "seconds": 2.0}]}
    assert "<i>" not in str(svg.timeline([line], "2026-01-01T00:00:02+00:00"))


def test_sign_in_goes_back_to_dashboard_pages_only() -> None:
    assert safe_next("/ui/jobs?state=QUEUED") == "/ui/jobs?state=QUEUED"
    for bad in ("https://evil.example/", "//evil.example/ui", "/v1/jobs", "/ui\\..", None, "",
                "/ui/\r\nSet-Cookie: x", "/uix"):
        assert safe_next(bad) == "/ui"


def test_rack_heat_classes() -> None:
    assert [heat(f, 16) for f in (0, 3, 8, 16)] == ["heat-0", "heat-1", "heat-2", "heat-5"]
    assert heat(0, 0) == "heat-0"


def test_report_totals_are_the_sum_of_the_bars() -> None:
    from broker.store.reports import HoursRow
    from broker.ui.pages_fleet import totals
    from broker.views.usage import usage_report

    first = [HoursRow("vision", "usage", 2.0, 4.0, 0.0), HoursRow("vision", "waste:failed",
                                                                  0.5, 1.0, 0.0)]
    second = [HoursRow("vision", "usage", 1.0, 2.0, 0.0), HoursRow("language", "usage",
                                                                   3.0, 3.0, 0.5)]
    summed = totals([usage_report(first, "team", None, None),
                     usage_report(second, "team", None, None)])
    whole = usage_report(first + second, "team", None, None)
    assert summed.model_dump() == whole.model_dump()


def test_sign_in_refuses_posts_from_other_sites(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'ui.db'}")
    try:
        app = build_app(load_config(ui_config(tmp_path / "isthmus.yaml")), db)
        c = TestClient(app, follow_redirects=False)
        body = {"token": TOKENS["root"], "next": "/ui/jobs"}
        evil = c.post("/ui/signin", data=body, headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403 and "set-cookie" not in evil.headers
        ok = c.post("/ui/signin", data=body, headers={"Origin": "http://testserver"})
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/jobs"
        assert "HttpOnly" in ok.headers["set-cookie"]
        assert c.get("/ui/jobs").status_code == 200  # the cookie signs the next page in
    finally:
        db.dispose()


def test_pages_say_their_server_time_and_the_api_does_not(tmp_path: Path) -> None:
    """bench/ui.py reads a page's server time from Server-Timing (broker/ui/timing.py)."""
    db = open_database(f"sqlite:///{tmp_path / 'ui.db'}")
    try:
        c = TestClient(build_app(load_config(ui_config(tmp_path / "isthmus.yaml")), db),
                       follow_redirects=False)
        page = c.get("/ui/signin")
        assert page.status_code == 200
        name, dur = page.headers["server-timing"].split(";")
        assert name == "app" and float(dur.removeprefix("dur=")) > 0
        assert "server-timing" in c.get("/ui/jobs").headers  # the redirect to sign in, too
        assert "server-timing" not in c.get("/v1/jobs").headers
    finally:
        db.dispose()
